"""Microsoft Teams: a gate as an Adaptive Card in its group's channel, posted and updated
through the Bot Connector's REST API; each person's view of it refreshed by Universal Actions
(`Action.Execute`, verb `tollgate.refresh`), so only people who may decide see Approve, Reject
and the form's fields; every request checked against the Bot Framework's OpenID keys
(signature, issuer, audience, expiry, service URL) and the tenant before anything is read.

Activities are the Microsoft 365 Agents SDK's schema (`microsoft-agents-activity`); the REST
calls and the token check are written here, small and synchronous, because the SDK's hosting
is asynchronous and fetches its keys from fixed hosts (docs/approvers.md, "Approvals in
Microsoft Teams").
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from functools import lru_cache

import jwt
import requests
from django.conf import settings
from microsoft_agents.activity import (
    Activity,
    AdaptiveCardInvokeValue,
    Attachment,
    ChannelAccount,
    ConversationParameters,
)
from pydantic import ValidationError
from urllib3.exceptions import ProtocolError

from workflows.chat import identities
from workflows.specs import values

from .base import AnswerLost, GateMessage, Press, Refused, Viewer

CARD = "application/vnd.microsoft.card.adaptive"
INVOKE = "adaptiveCard/action"
VERBS = {"tollgate.approve": "approve", "tollgate.reject": "reject",
         "tollgate.refresh": ""}
REFRESH_LIMIT = 60  # Teams refreshes a card by itself for at most 60 people


def plain(value) -> str:
    """A value Teams shows as it is: the Markdown that could make a link or emphasis
    escaped (and a heading or list marker at a line's start), and no address Teams would
    detect as a link (a zero-width space after what it looks for)."""
    text = re.sub(r"([\\`*_\[\]~<>])", r"\\\1", str(value))
    return values.unlinkable(re.sub(r"^(\s*)([#>+-])", r"\1\\\2", text, flags=re.MULTILINE))


LINK_ADDRESS = re.compile(r"\]\(https?://[^)\s]*")


def markdown(text: str) -> str:
    """Gate instructions as Teams' Markdown (no headings: they become bold lines); values
    filled into them are put in after, as plain text."""
    def convert(template: str) -> str:
        return re.sub(r"^#{1,6}\s+(.+)$", r"**\1**", template, flags=re.MULTILINE)

    if isinstance(text, values.Filled):
        return text.render(convert(text.template), plain, LINK_ADDRESS)
    return convert(text)


def _text(body: list, text: str, **style) -> None:
    body.append({"type": "TextBlock", "text": text, "wrap": True, **style})


def _input(field: dict, typed: dict) -> dict:
    kind, name = field["type"], field["name"]
    given = typed.get(name, field.get("default"))
    common = {"label": field.get("label") or name, "isRequired": bool(field.get("required"))
              and kind != "boolean"}
    if kind == "choice":
        return {"type": "Input.ChoiceSet", "id": f"field_{name}", "style": "compact", **common,
                "choices": [{"title": str(o), "value": str(o)} for o in field["options"]][:100],
                **({"value": str(given)} if given is not None else {})}
    if kind == "boolean":
        return {"type": "Input.Toggle", "id": f"flag_{name}", "title": common["label"],
                "valueOn": "true", "valueOff": "false",
                "value": "true" if given in (True, "true") else "false"}
    if kind == "number":
        # Teams sends what was typed as text, and shows a number input's value only as a
        # number: "25" is kept as 25 (text that is no number cannot be shown again).
        try:
            number = float(given) if given not in (None, "") else None
        except (TypeError, ValueError):
            number = None
        if number is not None and number.is_integer():
            number = int(number)
        return {"type": "Input.Number", "id": f"field_{name}", **common,
                **({"value": number} if number is not None else {})}
    return {"type": "Input.Text", "id": f"field_{name}", "isMultiline": kind == "text",
            **common, **({"value": str(given)} if given is not None else {})}


def _decide(message: GateMessage, typed: dict, comment: str, errors: dict) -> tuple:
    """The inputs and buttons of a person who may decide."""
    body, data = [], {"s": message.step_id, "a": message.attempt, "e": message.evidence}
    for field in message.form:
        body.append(_input(field, typed))
        if problem := errors.get(field["name"]):
            _text(body, plain(problem), color="attention", size="small", spacing="none")
    body.append({"type": "Input.Text", "id": "comment", "isMultiline": True,
                 "label": "Comment (required to reject)", "maxLength": 3000,
                 **({"value": comment} if comment else {})})
    if problem := errors.get("comment"):
        _text(body, plain(problem), color="attention", size="small", spacing="none")
    actions = [{"type": "Action.Execute", "verb": "tollgate.approve", "title": "Approve",
                "style": "positive", "data": data},
               {"type": "Action.Execute", "verb": "tollgate.reject", "title": "Reject",
                "style": "destructive", "data": data}]
    return body, actions


def card(message: GateMessage, viewer: Viewer | None = None, *, refresh_ids=(),
         typed: dict | None = None, comment: str = "", errors: dict | None = None) -> dict:
    """The gate's card: what it is, its run, params, the trail's last values, instructions,
    deadline and quorum; then what `viewer` may do (decide, sign on the page, link their
    account) or, for everyone (no viewer), a button that shows them their own."""
    body, actions = [], []
    _text(body, " · ".join(filter(None, (message.title, message.group))), weight="bolder",
          size="medium")
    _text(body, f"Run [{plain(message.run_title)}]({message.run_url})" + (
        f" · requested by {plain(message.requested_by)}" if message.requested_by else ""))
    if message.params:
        body.append({"type": "FactSet", "facts": [
            {"title": plain(label), "value": plain(value)[:1900]}
            for label, value in message.params[:10]]})
    for line in message.trail[-10:]:
        _text(body, plain(line), isSubtle=True, size="small", spacing="none")
    if message.instructions:
        _text(body, markdown(message.instructions)[:3000])
    status = f"**{message.approved} of {message.required}** approval" + (
        "s" if message.required != 1 else "")
    if message.decisions:
        status += " · " + "; ".join(plain(d) for d in message.decisions)
    if message.open and message.deadline_at:
        # Teams shows DATE() and TIME() in each reader's own time zone.
        at = message.deadline_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        status += (f"  \nDecide by {{{{DATE({at}, SHORT)}}}} {{{{TIME({at})}}}}: then it "
                   f"{message.deadline_then}.")
    _text(body, status)
    open_url = {"type": "Action.OpenUrl", "title": "Open in Tollgate", "url": message.run_url}
    if not message.open:
        _text(body, f"**{plain(message.outcome)}**")
    elif viewer is None:
        if message.signature:
            _text(body, f"This gate must be signed ({plain(message.signature)}): it is "
                        f"decided on its page in Tollgate, signing with "
                        f"{message.ways_to_sign}.", color="accent")
        actions.append({"type": "Action.Execute", "verb": "tollgate.refresh",
                        "title": "Approve or reject…",
                        "data": {"s": message.step_id, "a": message.attempt}})
    elif not viewer.linked:
        _text(body, "Tollgate does not know which of its users you are. Link your account "
                    "(signed in to Tollgate), then open this card again.", color="attention")
        actions.append({"type": "Action.OpenUrl", "title": "Link your account",
                        "url": viewer.link_url})
    elif viewer.refusal:
        _text(body, f"You cannot decide this: {plain(viewer.refusal)}", isSubtle=True)
    elif viewer.signature:
        _text(body, f"Your decision must be signed ({plain(viewer.signature)}): decide it "
                    f"on its page in Tollgate, signing with {message.ways_to_sign}.",
              color="accent")
        open_url["title"] = "Sign in Tollgate"
    else:
        inputs, actions = _decide(message, typed or {}, comment, errors or {})
        body += inputs
    actions.append(open_url)
    found = {"type": "AdaptiveCard", "version": "1.4", "body": body, "actions": actions,
             "$schema": "http://adaptivecards.io/schemas/adaptive-card.json"}
    if message.open:
        found["refresh"] = {"action": {"type": "Action.Execute", "verb": "tollgate.refresh",
                                       "data": {"s": message.step_id, "a": message.attempt}},
                            "userIds": list(refresh_ids)[:REFRESH_LIMIT]}
    return found


def _summary(message: GateMessage) -> str:
    if message.open:
        return f"{message.title} waits on {message.group or 'its approvers'}: " \
               f"{message.run_title}"
    return f"{message.title}: {message.outcome} · {message.run_title}"


def _dump(model) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def _message(message: GateMessage, refresh_ids=()) -> Activity:
    return Activity(type="message", summary=_summary(message)[:200], attachments=[
        Attachment(content_type=CARD, content=card(message, refresh_ids=refresh_ids))])


_tokens: dict[tuple, tuple[str, float]] = {}
_tokens_lock = threading.Lock()


TEAMS_CHANNEL = "msteams"


@lru_cache(maxsize=8)
def _keys(openid_url: str) -> jwt.PyJWKClient:
    """The Bot Framework's signing keys, from its OpenID metadata (a key not seen before
    makes the client fetch them again: keys roll over)."""
    metadata = requests.get(openid_url, timeout=settings.TOLLGATE_TEAMS_TIMEOUT_SECONDS)
    metadata.raise_for_status()
    return jwt.PyJWKClient(metadata.json()["jwks_uri"], cache_keys=True, lifespan=3600,
                           timeout=settings.TOLLGATE_TEAMS_TIMEOUT_SECONDS)


class Teams:
    name = "teams"
    label = "Teams"

    def __init__(self):
        self.app_id = settings.TOLLGATE_TEAMS_APP_ID
        self.tenant = settings.TOLLGATE_TEAMS_TENANT_ID
        self.service_url = settings.TOLLGATE_TEAMS_SERVICE_URL.rstrip("/") + "/"
        self.channels = settings.TOLLGATE_TEAMS_CHANNELS
        self.timeout = settings.TOLLGATE_TEAMS_TIMEOUT_SECONDS

    # Calls to the Bot Connector ----------------------------------------------------------

    def _token(self) -> str:
        """The app's token for the Bot Connector (client credentials), kept until a minute
        before it expires."""
        url = (settings.TOLLGATE_TEAMS_TOKEN_URL or
               f"https://login.microsoftonline.com/{self.tenant}/oauth2/v2.0/token")
        key = (url, self.app_id)
        with _tokens_lock:
            token, until = _tokens.get(key, ("", 0.0))
            if token and until > time.monotonic():
                return token
        answer = requests.post(url, timeout=self.timeout, data={
            "grant_type": "client_credentials", "client_id": self.app_id,
            "client_secret": settings.TOLLGATE_TEAMS_APP_PASSWORD,
            "scope": "https://api.botframework.com/.default"})
        answer.raise_for_status()
        found = answer.json()
        with _tokens_lock:
            _tokens[key] = (found["access_token"],
                            time.monotonic() + int(found.get("expires_in", 3600)) - 60)
        return found["access_token"]

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        answer = requests.request(method, self.service_url + path, json=body,
                                  timeout=self.timeout,
                                  headers={"Authorization": f"Bearer {self._token()}"})
        answer.raise_for_status()
        return answer.json() if answer.content else {}

    def _members(self, channel: str) -> list[dict]:
        """The channel's team roster (each with its Teams id and Entra object id)."""
        found, token = [], ""
        for _ in range(20):  # 10,000 people at most
            page = self._call("GET", f"v3/conversations/{channel}/pagedmembers?pageSize=500"
                              + (f"&continuationToken={token}" if token else ""))
            found += page.get("members") or []
            token = page.get("continuationToken") or ""
            if not token:
                break
        return found

    def _refresh_ids(self, channel: str, message: GateMessage) -> list[str]:
        """The Teams ids of the channel's members who may decide the gate now: their card
        refreshes by itself to show them the buttons."""
        if not message.open or not message.deciders:
            return []
        wanted = identities.object_ids(self.name, self.tenant, message.deciders)
        return [m["id"] for m in self._members(channel)
                if m.get("aadObjectId") in wanted][:REFRESH_LIMIT]

    def _thread(self, channel: str, ref: str) -> str:
        # A channel message's thread is its own conversation: "<channel>;messageid=<id>".
        return f"{channel};messageid={ref}"

    def _personal(self, member_id: str) -> str:
        """The one-to-one conversation with a person (made, or found, by Teams)."""
        params = ConversationParameters(
            is_group=False, bot=ChannelAccount(id=f"28:{self.app_id}"), tenant_id=self.tenant,
            members=[ChannelAccount(id=member_id)], channel_data={"tenant": {"id": self.tenant}})
        return self._call("POST", "v3/conversations", _dump(params))["id"]

    def _say(self, conversation: str, text: str) -> None:
        self._call("POST", f"v3/conversations/{conversation}/activities",
                   _dump(Activity(type="message", text=text, text_format="markdown")))

    # ChatProvider ------------------------------------------------------------------------

    def post(self, channel: str, message: GateMessage) -> str:
        params = ConversationParameters(
            is_group=True, bot=ChannelAccount(id=f"28:{self.app_id}"), tenant_id=self.tenant,
            channel_data={"channel": {"id": channel}, "tenant": {"id": self.tenant}},
            activity=_message(message, self._refresh_ids(channel, message)))
        try:
            return self._call("POST", "v3/conversations", _dump(params))["activityId"]
        except requests.RequestException as exc:
            if _answer_lost(exc):
                raise AnswerLost(str(exc)) from exc
            raise

    def find(self, channel: str, step_id: int, attempt: int) -> str | None:
        # The Bot Connector cannot list a channel's messages: a post whose answer was lost
        # raises AnswerLost and is not posted again; a press on the card names it.
        return None

    def update(self, channel: str, ref: str, message: GateMessage) -> None:
        activity = _message(message, self._refresh_ids(channel, message))
        activity.id = ref
        self._call("PUT", f"v3/conversations/{self._thread(channel, ref)}/activities/{ref}",
                   _dump(activity))

    def remind(self, channel: str, ref: str, message: GateMessage) -> None:
        text = (f"Reminder: **{plain(message.title)}** still waits on "
                f"{plain(message.group or 'its approvers')} "
                f"({message.approved} of {message.required} approval"
                f"{'s' if message.required != 1 else ''}).")
        self._say(self._thread(channel, ref), text)

    def tell(self, press: Press, text: str) -> None:
        self._say(self._personal(press.context["user"]), text)

    def dm(self, chat_user: str, text: str) -> None:
        # An Entra object id names the person (the app installed for them personally).
        self._say(self._personal(chat_user), text)

    def email_of(self, press: Press) -> str:
        member = self._call("GET", f"v3/conversations/{press.context['conversation']}"
                                   f"/members/{press.context['user']}")
        return member.get("email") or ""

    def object_id_of(self, press: Press) -> str:
        return press.chat_user  # the account is named by its Entra object id

    def ack(self, press: Press) -> dict | None:
        verb = "approval" if press.decision == "approve" else "rejection"
        return {"statusCode": 200, "type": "application/vnd.microsoft.activity.message",
                "value": f"Your {verb} was received; the card shows it once recorded."}

    def view(self, press: Press, message: GateMessage, viewer: Viewer) -> dict | None:
        return {"statusCode": 200, "type": CARD, "value": card(
            message, viewer, refresh_ids=[press.context["user"]] if message.open else [])}

    def form_errors(self, errors: dict[str, str], press: Press,
                    message: GateMessage) -> dict:
        return {"statusCode": 200, "type": CARD, "value": card(
            message, Viewer(linked=True), refresh_ids=[press.context["user"]],
            typed=press.values, comment=press.comment, errors=errors)}

    def verify(self, headers, body: bytes) -> str:
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or not token:
            raise Refused("Not signed by the Bot Framework (no bearer token).")
        try:
            key = _keys(settings.TOLLGATE_TEAMS_OPENID_URL).get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=self.app_id,
                                issuer=settings.TOLLGATE_TEAMS_ISSUER, leeway=300,
                                options={"require": ["exp", "iss", "aud", "serviceUrl"]})
        except (jwt.PyJWTError, requests.RequestException, KeyError, ValueError) as exc:
            raise Refused(f"The Bot Framework token is not valid: {exc}") from None
        activity = _activity(body)
        # The Bot Framework signs for every channel of the bot. Web Chat and Direct Line are
        # driven by web pages that write the tenant and the person's object id themselves:
        # only Teams vouches for them, and only a key endorsed for Teams signs for it.
        if activity.channel_id != TEAMS_CHANNEL:
            raise Refused(f"The activity comes through the {activity.channel_id or 'unnamed'} "
                          "channel, not Microsoft Teams.")
        if TEAMS_CHANNEL not in (key._jwk_data.get("endorsements") or []):
            raise Refused("The key that signed the token is not endorsed for Microsoft "
                          "Teams.")
        if claims["serviceUrl"].rstrip("/") != (activity.service_url or "").rstrip("/"):
            raise Refused("The token was issued for another service URL than the activity's.")
        tenant = _tenant(activity)
        if not self.tenant:
            raise Refused("TOLLGATE_TEAMS_TENANT_ID is not set: no tenant's request is taken.")
        if tenant != self.tenant:
            raise Refused(f"The activity comes from another tenant ({tenant or 'none'}).")
        if not activity.id:
            raise Refused("The activity has no id.")
        return hashlib.sha256(
            f"{activity.id}|{activity.conversation.id if activity.conversation else ''}"
            .encode()).hexdigest()

    def parse(self, body: bytes) -> tuple[str, dict]:
        activity = _activity(body)
        kind = f"{activity.type}/{activity.name}" if activity.name else str(activity.type)
        return kind, json.loads(body)

    def press_of(self, payload: dict) -> Press | None:
        try:
            activity = Activity.model_validate(payload)
            if activity.type != "invoke" or activity.name != INVOKE:
                return None
            action = AdaptiveCardInvokeValue.model_validate(activity.value).action
            if action.type != "Action.Execute" or action.verb not in VERBS:
                return None
            data = action.data or {}
            person = activity.from_property
            if not person.aad_object_id:
                return None  # not an account of the company's directory
            # A channel message's thread is "<channel>;messageid=<the card's id>".
            ref = activity.conversation.id.partition(";messageid=")[2]
            who = {"team": _tenant(activity), "chat_user": person.aad_object_id,
                   "chat_name": person.name or "", "channel": activity.conversation.id,
                   "context": {"user": person.id, "conversation": activity.conversation.id},
                   "ref": ref}
            step_id, attempt = int(data["s"]), int(data["a"])
        except (ValidationError, AttributeError, KeyError, TypeError, ValueError):
            return None
        if not VERBS[action.verb]:
            return Press("view", "", step_id, attempt, **who)
        fields = {name[6:]: value for name, value in data.items()
                  if name.startswith("field_") and value not in ("", None)}
        fields |= {name[5:]: value == "true" for name, value in data.items()
                   if name.startswith("flag_")}
        return Press("form", VERBS[action.verb], step_id, attempt,
                     comment=str(data.get("comment") or ""), values=fields, **who,
                     seen=str(data.get("e") or ""))


def _answer_lost(exc: requests.RequestException) -> bool:
    """Did the request go out with its answer lost (read timed out, connection cut after
    sending)? A connection refused or never made sent nothing, and is simply tried again."""
    if isinstance(exc, requests.ConnectTimeout):
        return False
    if isinstance(exc, requests.ReadTimeout):
        return True
    reason = exc.args[0] if exc.args else None
    return isinstance(exc, requests.ConnectionError) and isinstance(reason, ProtocolError)


def _activity(body: bytes) -> Activity:
    try:
        return Activity.model_validate_json(body)
    except ValidationError:
        raise Refused("The request is not a Bot Framework activity.") from None


def _tenant(activity: Activity) -> str:
    return ((activity.conversation.tenant_id if activity.conversation else None)
            or ((activity.channel_data or {}).get("tenant") or {}).get("id") or "")


def enabled() -> bool:
    # Without the tenant every request is refused (verify), and `check` says so (E006).
    return bool(settings.TOLLGATE_TEAMS_APP_ID and settings.TOLLGATE_TEAMS_APP_PASSWORD)


def provider():
    """Teams, when it is set up (the app's id and secret), else None."""
    return Teams() if enabled() else None
