"""Mail as it arrives from outside: replies written as a mail program writes them, signed with
DKIM by a test key whose record the test DNS serves (settings.TOLLGATE_DKIM_DNS names
`dns_txt`; a process started by a test reads the records from the file
TOLLGATE_TEST_DKIM_RECORDS names)."""

from __future__ import annotations

import base64
import json
import os
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid, parseaddr
from functools import cache

import dkim
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.utils import timezone

RECORDS: dict[str, str] = {}  # "sel._domainkey.example.com." -> the TXT record


def dns_txt(name: bytes, timeout: float = 5) -> bytes | None:
    """The DKIM records tests publish (what the resolver would answer), else none."""
    key = name.decode().lower().rstrip(".")
    records = dict(RECORDS)
    if path := os.environ.get("TOLLGATE_TEST_DKIM_RECORDS"):
        with open(path) as f:
            records.update(json.load(f))
    found = records.get(key)
    return found.encode() if found else None


@cache
def _key(domain: str) -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    RECORDS[f"sel._domainkey.{domain}"] = f"v=DKIM1; k=rsa; p={base64.b64encode(public).decode()}"
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def publish(path) -> None:
    """Write the records published so far where a process of a test reads them."""
    path.write_text(json.dumps(RECORDS))


def reply(to: str, sender: str, text: str, *, subject: str = "Re: [Tollgate] QA sign-off",
          signed_by: str | None = "", headers: dict | None = None,
          body_length: bool = False) -> bytes:
    """A reply as a person's mail program sends it, its quoted original below the text,
    DKIM-signed by the sender's own domain (`signed_by` "", the default), by another domain,
    or not at all (None); `body_length` signs with l=, covering only the body as it was."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = subject
    message["Date"] = format_datetime(timezone.now())
    domain = parseaddr(sender)[1].rpartition("@")[2]
    message["Message-ID"] = make_msgid(domain=domain)
    for name, value in (headers or {}).items():
        message[name] = value
    message.set_content(f"{text}\n\nOn Mon, 7 Dec 2026 at 09:00, Tollgate "
                        "<tollgate@example.org> wrote:\n> QA sign-off of run 1 waits on qa.\n"
                        "> Or reply to this mail with \"approve\" or \"reject\".\n")
    raw = message.as_bytes()
    if signed_by is None:
        return raw
    domain = signed_by or domain
    signature = dkim.sign(raw, b"sel", domain.encode(), _key(domain),
                          include_headers=[b"from", b"to", b"subject", b"date", b"message-id"],
                          length=body_length)
    return signature + raw


class PipingMailServer:
    """A receiving mail server (aiosmtpd, on a socket the OS bound) that delivers each
    recipient's copy to `command` on stdin, as Postfix's pipe transport does, and answers
    the sender by its exit code: 0 taken, 75 try again later (451), anything else refused
    (554). `answers` keeps what each delivery said."""

    def __init__(self, command: list[str], env: dict, cwd):
        import asyncio
        import threading

        from aiosmtpd.smtp import SMTP

        from .processes import listener, patience

        self.command, self.env, self.cwd = command, env, cwd
        self.answers: list[tuple[int, str]] = []
        sock = listener()
        self.port = sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        serving = threading.Event()

        def serve() -> None:
            # The loop is made to run in its own thread only: the test's thread may hold a
            # running loop of its own (Playwright's sync API leaves one).
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(
                self.loop.create_server(lambda: SMTP(self), sock=sock))
            serving.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert serving.wait(patience()), "the mail server did not start"

    async def handle_DATA(self, server, session, envelope) -> str:
        import asyncio

        for recipient in envelope.rcpt_tos:
            proc = await asyncio.create_subprocess_exec(
                *self.command, "--recipient", recipient, cwd=self.cwd, env=self.env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT)
            out, _ = await proc.communicate(envelope.original_content)
            self.answers.append((proc.returncode, out.decode()))
            if proc.returncode == 75:
                return "451 4.3.0 Temporary failure, try again later"
            if proc.returncode != 0:
                return "554 5.6.0 Refused"
        return "250 OK"

    def send(self, raw: bytes, sender: str, recipient: str):
        """Send one message through this server as another mail server would; the SMTP
        error it refused with, or None when it took it."""
        import smtplib

        with smtplib.SMTP("127.0.0.1", self.port, timeout=120) as smtp:
            try:
                smtp.sendmail(sender, [recipient], raw)
            except smtplib.SMTPResponseException as exc:
                return exc
        return None

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def decision_links(text: str) -> list[tuple[int, int, int]]:
    """(person, gate, attempt) of each signed decision link in a message: read back, not
    compared as text (a link signed a second later is another string for the same gate)."""
    import re

    from workflows.delivery import links

    found = []
    for token in re.findall(r"/decide/([^/\s\"']+)/", text):
        link = links.read(token)
        found.append((link.user_id, link.step_id, link.attempt))
    return found
