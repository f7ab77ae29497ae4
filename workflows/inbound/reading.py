"""What a reply says: the decision on its first line and the comment after it, with the
quoted mail and the signature left out (mail-parser-reply); and what is no one's reply at
all: an auto-reply (RFC 3834's Auto-Submitted, and the headers vacation responders set
instead) or a forward."""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import getaddresses

from django.utils.html import strip_tags
from mailparser_reply import EmailReplyParser

WORDS = {"approve": "approve", "approved": "approve", "reject": "reject",
         "rejected": "reject"}
# The languages whose "On ... wrote:" lines and signatures the parser knows.
LANGUAGES = ["en", "de", "fr", "it", "es", "nl", "pl", "sv", "cs", "ja", "zh", "ko"]
FORWARD = re.compile(r"^\s*(fwd?|fw|wg|tr|rv|vs|i)\s*:", re.IGNORECASE)
AUTO_SUBJECT = re.compile(r"^\s*(auto(matic)? ?(reply|response)|out of (the )?office|"
                          r"autoreply|abwesenheit)", re.IGNORECASE)


@dataclass(frozen=True)
class Answer:
    decision: str  # "approve", "reject", or "" when the first line says neither
    comment: str
    first_line: str


def auto_reply(message: EmailMessage) -> str:
    """Why this message was sent by a program rather than a person ("" when it was not)."""
    auto = str(message.get("Auto-Submitted", "no")).split(";")[0].strip().lower()
    if auto != "no":
        return f"Auto-Submitted: {auto}"
    for header in ("X-Autoreply", "X-Autorespond"):
        if message.get(header):
            return header
    precedence = str(message.get("Precedence", "")).strip().lower()
    if precedence in ("auto_reply", "bulk", "junk", "list"):
        return f"Precedence: {precedence}"
    if AUTO_SUBJECT.match(str(message.get("Subject", ""))):
        return "its subject says it is an automatic reply"
    return ""


def forwarded(message: EmailMessage) -> bool:
    """Whether the subject says this is a forward of the mail, not a reply to it."""
    return bool(FORWARD.match(str(message.get("Subject", ""))))


def recipients(message: EmailMessage) -> list[str]:
    """Every address the message was sent to, as its headers say (the mail server's
    envelope recipient, where it gives one, is read first by the caller)."""
    found = []
    for header in ("Delivered-To", "X-Original-To", "To", "Cc"):
        found += [address for _, address in getaddresses(message.get_all(header) or [])]
    return found


def _text(message: EmailMessage) -> str:
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    content = part.get_content()
    return strip_tags(content) if part.get_content_subtype() == "html" else content


def answer(message: EmailMessage) -> Answer:
    """The decision the reply's first line asks for, and the comment after it."""
    text = _text(message).replace("\r\n", "\n")
    reply = EmailReplyParser(languages=LANGUAGES).parse_reply(text=text) or ""
    lines = [line.strip() for line in reply.strip().splitlines()]
    if "--" in lines:  # the signature's delimiter ("-- ", often sent without its space)
        lines = lines[:lines.index("--")]
    lines = [line for line in lines if not line.startswith(">")]
    while lines and not lines[0]:
        lines.pop(0)
    if not lines:
        return Answer("", "", "")
    first = lines[0]
    word, _, rest = first.partition(" ")
    decision = WORDS.get(word.strip(".,:;!-").lower(), "")
    comment = "\n".join([rest.strip(" .,:;-"), *lines[1:]]).strip() if decision else ""
    return Answer(decision, comment, first[:200])
