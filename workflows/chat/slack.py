"""Slack: messages with Block Kit buttons, forms as modals, requests checked with Slack's
signing secret (slack-sdk's WebClient and SignatureVerifier)."""

from __future__ import annotations

import hashlib
import json
import re
from urllib.parse import parse_qs

from django.conf import settings
from slack_sdk import WebClient
from slack_sdk.signature import SignatureVerifier

from workflows.specs import values

from .base import GateMessage, Press, Refused

ACTIONS = {"tollgate_approve": "approve", "tollgate_reject": "reject"}
FORM_CALLBACK = "tollgate_decide"


METADATA_EVENT = "tollgate_gate"


def escape(text) -> str:
    """Slack's three control characters, escaped (a value cannot become a link or mention)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mrkdwn(markdown: str) -> str:
    """Gate instructions (Markdown) as Slack's mrkdwn: bold, italics, links, headings, code;
    everything else as written, escaped. Values filled into them (a `values.Filled`) go in
    after, as text: escaped, unlinkable and unformatted."""
    if isinstance(markdown, values.Filled):
        return markdown.render(_mrkdwn(markdown.template), plain_text, LINK_ADDRESS)
    return _mrkdwn(markdown)


LINK_ADDRESS = re.compile(r"<https?://[^|>]*")


def plain_text(value: str) -> str:
    """A value that Slack shows as it is: no link, mention or formatting (a zero-width space
    after each character Slack reads as markup)."""
    return values.unlinkable(re.sub(r"([*_~`|])", "\\1\u200b", escape(value)))


def _mrkdwn(markdown: str) -> str:
    text = escape(markdown)
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"<\2|\1>", text)
    text = re.sub(r"^#{1,6}\s+(.+)$", r"*\1*", text, flags=re.MULTILINE)
    text = re.sub(r"(?<![*\w])\*(?!\*)([^*\n]+)\*(?!\*)", r"_\1_", text)  # *em* -> _em_
    text = re.sub(r"\*\*([^*\n]+)\*\*", r"*\1*", text)  # **strong** -> *strong*
    return text


def _deadline(message: GateMessage) -> str:
    # Slack shows a <!date> in each reader's own time zone.
    at = message.deadline_at
    return (f"Decide by <!date^{int(at.timestamp())}^{{date_short_pretty}} {{time}}|"
            f"{at:%Y-%m-%d %H:%M %Z}>: then it {message.deadline_then}.")


def blocks(message: GateMessage) -> list[dict]:
    """The gate's message: what it is, its run, params, the trail's last values,
    instructions, deadline and quorum, and the buttons while it waits."""
    found = [
        {"type": "header", "text": {"type": "plain_text", "emoji": False,
                                    "text": " · ".join(filter(None, (
                                        message.title, message.group)))[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": (
            f"Run <{message.run_url}|{plain_text(message.run_title)}>"
            + (f" · requested by {escape(message.requested_by)}"
               if message.requested_by else ""))}},
    ]
    if message.params:
        found.append({"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*{escape(label)}*\n{plain_text(value)[:1900]}"}
            for label, value in message.params[:10]]})
    if message.trail:
        found.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": plain_text(line)[:2000]}
            for line in message.trail[-10:]]})
    if message.instructions:
        found.append({"type": "section",
                      "text": {"type": "mrkdwn", "text": mrkdwn(message.instructions)[:3000]}})
    status = f"*{message.approved} of {message.required}* approval" + (
        "s" if message.required != 1 else "")
    if message.decisions:
        status += " · " + "; ".join(escape(d) for d in message.decisions)
    if message.open and message.deadline_at:
        status += "\n" + _deadline(message)
    found.append({"type": "section", "text": {"type": "mrkdwn", "text": status[:3000]}})
    if message.open and message.signature:
        # A press cannot sign: the gate is decided on its page.
        found.append({"type": "section", "text": {"type": "mrkdwn", "text": (
            f"*This gate must be signed* ({escape(message.signature)}): decide it on its "
            f"page in Tollgate, signing with {message.ways_to_sign}.")[:3000]}})
        found.append({"type": "actions", "block_id": "tollgate_sign", "elements": [
            {"type": "button", "action_id": "tollgate_open", "style": "primary",
             "text": {"type": "plain_text", "text": "Sign in Tollgate"},
             "url": message.run_url}]})
    elif message.open:
        value = f"{message.step_id}:{message.attempt}:{message.evidence}"
        found.append({"type": "actions", "block_id": "tollgate_decide", "elements": [
            {"type": "button", "action_id": "tollgate_approve", "style": "primary",
             "text": {"type": "plain_text", "text": "Approve…" if message.has_form
                      else "Approve"}, "value": value},
            {"type": "button", "action_id": "tollgate_reject", "style": "danger",
             "text": {"type": "plain_text", "text": "Reject…"}, "value": value}]})
    else:
        found.append({"type": "section", "text": {"type": "mrkdwn",
                                                  "text": f"*{escape(message.outcome)}*"}})
    return found


def _text(message: GateMessage) -> str:
    if message.open:
        return f"{message.title} waits on {message.group or 'its approvers'}: " \
               f"{message.run_title}"
    return f"{message.title}: {message.outcome} · {message.run_title}"


def _input(field: dict) -> dict:
    kind, name = field["type"], field["name"]
    label = {"type": "plain_text", "text": (field.get("label") or name)[:2000]}
    default = field.get("default")
    if kind == "choice":
        options = [{"text": {"type": "plain_text", "text": str(o)[:75]}, "value": str(o)}
                   for o in field.get("options", [])][:100]
        element = {"type": "static_select", "action_id": "value", "options": options}
        if default is not None and str(default) in [o["value"] for o in options]:
            element["initial_option"] = next(o for o in options if o["value"] == str(default))
    elif kind == "boolean":
        yes = {"text": {"type": "plain_text", "text": "Yes"}, "value": "true"}
        element = {"type": "checkboxes", "action_id": "value", "options": [yes]}
        if default is True:
            element["initial_options"] = [yes]
    elif kind == "number":
        element = {"type": "number_input", "action_id": "value", "is_decimal_allowed": True}
        if default is not None:
            element["initial_value"] = str(default)
    else:
        element = {"type": "plain_text_input", "action_id": "value",
                   "multiline": kind == "text"}
        if default is not None:
            element["initial_value"] = str(default)
    block = {"type": "input", "block_id": f"field_{name}", "label": label, "element": element,
             "optional": kind == "boolean" or not field.get("required", False)}
    if field.get("description"):
        block["hint"] = {"type": "plain_text", "text": field["description"][:2000]}
    return block


def modal(press: Press, message: GateMessage) -> dict:
    """The form for a press: the gate's fields when approving, and a comment (required to
    reject)."""
    approving = press.decision == "approve"
    fields = [_input(f) for f in message.form] if approving else []
    comment = {"type": "input", "block_id": "comment", "optional": approving,
               "label": {"type": "plain_text", "text": "Comment" if approving
                         else "Why? (required to reject)"},
               "element": {"type": "plain_text_input", "action_id": "value",
                           "multiline": True, "max_length": 3000}}
    verb = "Approve" if approving else "Reject"
    return {"type": "modal", "callback_id": FORM_CALLBACK,
            "private_metadata": json.dumps({"s": press.step_id, "a": press.attempt,
                                            "d": press.decision, "c": press.channel,
                                            "e": press.seen}),
            "title": {"type": "plain_text", "text": verb},
            "submit": {"type": "plain_text", "text": verb},
            "close": {"type": "plain_text", "text": "Cancel"},
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": (
                f"*{escape(message.title)}* · <{message.run_url}|"
                f"{escape(message.run_title)}>")}}, *fields, comment]}


def _form_values(view: dict) -> tuple[dict, str]:
    """(field values by name, comment) from a submitted modal's state."""
    values, comment = {}, ""
    for block_id, actions in (view.get("state", {}).get("values") or {}).items():
        entry = actions.get("value") or {}
        kind = entry.get("type")
        if kind == "static_select":
            value = (entry.get("selected_option") or {}).get("value")
        elif kind == "checkboxes":
            value = bool(entry.get("selected_options"))
        else:
            value = entry.get("value")
        if block_id == "comment":
            comment = value or ""
        elif block_id.startswith("field_") and value is not None:
            values[block_id[6:]] = value
    return values, comment


class Slack:
    name = "slack"
    label = "Slack"

    def __init__(self, token: str | None = None, signing_secret: str | None = None,
                 base_url: str | None = None):
        self.client = WebClient(token=token or settings.TOLLGATE_SLACK_BOT_TOKEN,
                                base_url=base_url or settings.TOLLGATE_SLACK_API_URL,
                                timeout=settings.TOLLGATE_SLACK_TIMEOUT_SECONDS)
        self.verifier = SignatureVerifier(signing_secret
                                          or settings.TOLLGATE_SLACK_SIGNING_SECRET)
        self.channels = settings.TOLLGATE_SLACK_CHANNELS

    def post(self, channel: str, message: GateMessage) -> str:
        # The message carries its gate and attempt (Slack's message metadata), so a post
        # whose answer was lost is found again instead of posted twice (find).
        response = self.client.chat_postMessage(
            channel=channel, text=_text(message), blocks=blocks(message), unfurl_links=False,
            metadata={"event_type": METADATA_EVENT,
                      "event_payload": {"step": message.step_id, "attempt": message.attempt}})
        return response["ts"]

    def find(self, channel: str, step_id: int, attempt: int) -> str | None:
        """The channel's recent messages (the last 200, with their metadata) searched for
        this gate attempt's."""
        answer = self.client.conversations_history(channel=channel, limit=200,
                                                   include_all_metadata=True)
        for posted in answer.get("messages") or []:
            meta = posted.get("metadata") or {}
            payload = meta.get("event_payload") or {}
            if (meta.get("event_type") == METADATA_EVENT and payload.get("step") == step_id
                    and payload.get("attempt") == attempt):
                return posted["ts"]
        return None

    def update(self, channel: str, ref: str, message: GateMessage) -> None:
        self.client.chat_update(channel=channel, ts=ref, text=_text(message),
                                blocks=blocks(message))

    def remind(self, channel: str, ref: str, message: GateMessage) -> None:
        # In the gate's thread, also sent to the channel, so it is seen without opening it.
        text = (f"Reminder: *{message.title}* still waits on "
                f"{message.group or 'its approvers'} "
                f"({message.approved} of {message.required} approval"
                f"{'s' if message.required != 1 else ''}).")
        if message.deadline_at:
            text += " " + _deadline(message)
        self.client.chat_postMessage(channel=channel, thread_ts=ref, reply_broadcast=True,
                                     text=text, unfurl_links=False)

    def open_form(self, press: Press, message: GateMessage) -> None:
        self.client.views_open(trigger_id=press.trigger, view=modal(press, message))

    def tell(self, press: Press, text: str) -> None:
        self.client.chat_postEphemeral(channel=press.channel, user=press.chat_user, text=text)

    def dm(self, chat_user: str, text: str) -> None:
        # A user id as the channel: Slack opens the person's direct messages with the app.
        self.client.chat_postMessage(channel=chat_user, text=text, unfurl_links=False)

    def email_of(self, press: Press) -> str:
        user = self.client.users_info(user=press.chat_user)["user"]
        return (user.get("profile") or {}).get("email") or ""

    def object_id_of(self, press: Press) -> str:
        return ""  # Slack knows no company directory id

    def ack(self, press: Press) -> dict | None:
        return None  # Slack wants an empty 200; the message is updated once decided

    def view(self, press, message, viewer) -> dict | None:
        return None  # one message for everyone: Slack never asks for a person's view

    def verify(self, headers, body: bytes) -> str:
        timestamp = headers.get("X-Slack-Request-Timestamp", "")
        signature = headers.get("X-Slack-Signature", "")
        if not timestamp or not signature:
            raise Refused("Not signed by Slack (no X-Slack-Signature).")
        # is_valid also refuses a timestamp more than 5 minutes from now.
        if not self.verifier.is_valid(body=body, timestamp=timestamp, signature=signature):
            raise Refused("The Slack signature does not match, or the request is older "
                          "than 5 minutes.")
        return hashlib.sha256(signature.encode()).hexdigest()

    def parse(self, body: bytes) -> tuple[str, dict]:
        try:
            raw = parse_qs(body.decode(), strict_parsing=True)["payload"][0]
            payload = json.loads(raw)
        except (KeyError, ValueError, UnicodeDecodeError):
            raise Refused("The request carries no interaction payload.") from None
        if not isinstance(payload, dict):
            raise Refused("The interaction payload is not an object.")
        return str(payload.get("type", "")), payload

    def press_of(self, payload: dict) -> Press | None:
        user = payload.get("user") or {}
        team = (payload.get("team") or {}).get("id") or user.get("team_id") or ""
        who = {"team": team, "chat_user": user.get("id", ""),
               "chat_name": user.get("username") or user.get("name") or ""}
        try:
            if payload.get("type") == "block_actions":
                action = next(a for a in payload.get("actions", [])
                              if a.get("action_id") in ACTIONS)
                step, attempt, seen = (action["value"].split(":") + [""])[:3]
                return Press("button", ACTIONS[action["action_id"]], int(step), int(attempt),
                             channel=(payload.get("channel") or {}).get("id", ""),
                             trigger=payload.get("trigger_id", ""), seen=seen, **who)
            if payload.get("type") == "view_submission":
                view = payload.get("view") or {}
                if view.get("callback_id") != FORM_CALLBACK:
                    return None
                meta = json.loads(view.get("private_metadata") or "{}")
                values, comment = _form_values(view)
                return Press("form", meta["d"], int(meta["s"]), int(meta["a"]),
                             channel=meta.get("c", ""), comment=comment, values=values,
                             seen=str(meta.get("e") or ""), **who)
        except (StopIteration, KeyError, ValueError, TypeError, AttributeError):
            return None
        return None

    def form_errors(self, errors: dict[str, str], press: Press,
                    message: GateMessage) -> dict:
        return {"response_action": "errors", "errors": {
            ("comment" if name == "comment" else f"field_{name}"): problem
            for name, problem in errors.items()}}


def enabled() -> bool:
    return bool(settings.TOLLGATE_SLACK_BOT_TOKEN and settings.TOLLGATE_SLACK_SIGNING_SECRET)


def provider():
    """Slack, when it is set up (bot token and signing secret), else None."""
    return Slack() if enabled() else None
