"""The chat side behind one small interface: what Tollgate asks of a chat platform, and the
platform-neutral gate message and press."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class GateMessage:
    """A gate as chat shows it: the card's essentials, and whether it still takes a press."""

    step_id: int
    attempt: int
    title: str
    group: str  # whom it waits on now, in words ("qa", "dave (alice's manager)"); "" if nobody
    run_title: str
    run_url: str
    requested_by: str
    params: list[tuple[str, str]]  # (label, value)
    trail: list[str]  # "Build: completed; version = 1.2"
    instructions: str  # Markdown, as the spec wrote it (placeholders filled)
    deadline_at: object | None  # an aware datetime
    deadline_then: str  # "rejects itself", "escalates to ops"
    approved: int
    required: int
    decisions: list[str]  # "ann approved via inbox card"
    open: bool  # still waiting: the buttons show
    outcome: str  # when not open: "Approved", "Rejected by bob: broken", "Cancelled", ...
    has_form: bool
    form: list[dict] = field(default_factory=list)  # approval.form fields
    deciders: list[int] = field(default_factory=list)  # who may decide it now (user ids)
    # The digest of the evidence the message shows: its buttons carry it back, so a press
    # decides on what the person was shown or not at all (the engine's `seen`).
    evidence: str = ""
    # What signing it means when it must be signed ("" when not): a press cannot sign, so
    # it is decided on its page, in one of the ways `ways_to_sign` names.
    signature: str = ""
    ways_to_sign: str = ""


@dataclass
class Press:
    """A person's press in chat, parsed from the platform's request."""

    kind: str  # "button", "form" (a press that carries its fields) or "view" (a refresh)
    decision: str  # "approve" or "reject" ("" for a view)
    step_id: int
    attempt: int
    team: str
    chat_user: str
    chat_name: str
    channel: str  # where to answer them privately
    trigger: str = ""  # for opening a form (a button press)
    comment: str = ""
    values: dict = field(default_factory=dict)
    # What else the platform needs to answer this person (Teams: the conversation and the
    # service it came through, the account's Entra object id).
    context: dict = field(default_factory=dict)
    seen: str = ""  # the evidence digest of the message pressed
    # The platform's reference of the message pressed, where the press names it ("" if not).
    ref: str = ""


@dataclass
class Viewer:
    """What one person may do with a gate, for a platform that shows each person their own
    view of a message (Teams): decide it, sign it on its page, link their account first, or
    nothing, and why."""

    linked: bool
    link_url: str = ""
    refusal: str = ""  # why they may not decide ("" when they may)
    signature: str = ""  # the meaning their decision must be signed with, on the page


class ChatProvider(Protocol):
    """What a chat platform does for Tollgate. Everything else (who may decide, quorum,
    four-eyes, the audit, retries through the outbox) is Tollgate's and the same for all."""

    name: str  # "slack"
    label: str  # "Slack", as pages name the channel
    channels: dict[str, str]  # approval group -> the platform's channel id

    def post(self, channel: str, message: GateMessage) -> str:
        """Post a gate; returns the message's reference (to update it)."""

    def find(self, channel: str, step_id: int, attempt: int) -> str | None:
        """The reference of this gate attempt's message, if one was posted to the channel
        already (a post whose answer was lost), else None."""

    def update(self, channel: str, ref: str, message: GateMessage) -> None:
        """Show the gate as it is now (quorum, decisions, final state, buttons or none)."""

    def remind(self, channel: str, ref: str, message: GateMessage) -> None:
        """Remind the channel that the gate still waits (a reply to its message)."""

    def open_form(self, press: Press, message: GateMessage) -> None:
        """Open the gate's form (its fields and a comment) for a button press, within the
        platform's time limit (a platform whose presses carry their fields, kind "form",
        is never asked)."""

    def tell(self, press: Press, text: str) -> None:
        """A private note to the person who pressed (a refusal and why, a link to follow)."""

    def dm(self, chat_user: str, text: str) -> None:
        """A direct message to a linked account (a delegate told whom they decide for)."""

    def email_of(self, press: Press) -> str:
        """The e-mail the platform has for the account that pressed ("" when none)."""

    def object_id_of(self, press: Press) -> str:
        """The company directory's id of the account (Entra's object id), "" if unknown."""

    def ack(self, press: Press) -> dict | None:
        """The answer to a press taken for deciding (None: an empty 200)."""

    def view(self, press: Press, message: GateMessage, viewer: Viewer) -> dict | None:
        """The answer to a "view" press: the gate as this person may act on it."""

    def verify(self, headers, body: bytes) -> str:
        """Check a request came from the platform (signature, freshness); returns a digest
        unique to the request (for replay refusal), or raises Refused."""

    def parse(self, body: bytes) -> tuple[str, dict]:
        """(kind, payload) of a verified request."""

    def press_of(self, payload: dict) -> Press | None:
        """The press a payload carries, if it is one of Tollgate's."""

    def form_errors(self, errors: dict[str, str], press: Press,
                    message: GateMessage) -> dict:
        """The platform's answer that shows these field errors in the open form."""


class AnswerLost(Exception):
    """A post that went out and whose answer never came (it timed out, or the connection
    was cut after sending), on a platform that cannot look its messages up: it may well be
    in the channel, so it is not posted again."""


class Refused(Exception):
    """A request that did not come from the platform, or came twice."""
