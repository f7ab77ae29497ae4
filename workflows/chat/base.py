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
    decisions: list[str]  # "ann approved (inbox card)"
    open: bool  # still waiting: the buttons show
    outcome: str  # when not open: "Approved", "Rejected by bob: broken", "Cancelled", ...
    has_form: bool
    form: list[dict] = field(default_factory=list)  # approval.form fields


@dataclass
class Press:
    """A person's press in chat, parsed from the platform's request."""

    kind: str  # "button" or "form"
    decision: str  # "approve" or "reject"
    step_id: int
    attempt: int
    team: str
    chat_user: str
    chat_name: str
    channel: str  # where to answer them privately
    trigger: str = ""  # for opening a form (a button press)
    comment: str = ""
    values: dict = field(default_factory=dict)


class ChatProvider(Protocol):
    """What a chat platform does for Tollgate. Everything else (who may decide, quorum,
    four-eyes, the audit, retries through the outbox) is Tollgate's and the same for all."""

    name: str  # "slack"

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
        """Open the gate's form (its fields and a comment) for a press, within the
        platform's time limit."""

    def tell(self, channel: str, chat_user: str, text: str) -> None:
        """A private note to one person (a refusal and why, a link to follow)."""

    def email_of(self, chat_user: str) -> str:
        """The e-mail the platform has for the account ("" when it has none)."""

    def verify(self, headers, body: bytes) -> str:
        """Check a request came from the platform (signature, freshness); returns a digest
        unique to the request (for replay refusal), or raises Refused."""

    def parse(self, body: bytes) -> tuple[str, dict]:
        """(kind, payload) of a verified request."""

    def press_of(self, payload: dict) -> Press | None:
        """The press a payload carries, if it is one of Tollgate's."""

    def form_errors(self, errors: dict[str, str]) -> dict:
        """The platform's answer that shows these field errors in the open form."""


class Refused(Exception):
    """A request that did not come from the platform, or came twice."""
