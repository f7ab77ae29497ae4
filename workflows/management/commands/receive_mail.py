"""`manage.py receive_mail`: one mail, as the mail server pipes it (RFC 5322 on stdin).

For a mail server's pipe (Postfix's `pipe`, Exim's `pipe` transport, a .forward's `|`): the
reply address's domain delivered to this command. Exit codes are sysexits.h's, which mail
servers act on: 0 handled (decided, refused and answered, or dropped), 75 (EX_TEMPFAIL) when
the database cannot be reached, so the server keeps the mail and tries again, 65
(EX_DATAERR) for input that is no mail at all."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand
from django.db import InterfaceError, OperationalError

from workflows.inbound import replies

EX_DATAERR, EX_TEMPFAIL = 65, 75
LIMIT = 25 * 1024 * 1024  # larger than any reply; a bigger message is no reply


class Command(BaseCommand):
    help = ("Read one mail (a reply to a gate's mail) on stdin and decide by it, or answer "
            "why not. Exits 75 when the database is away, so the mail server retries.")
    requires_system_checks = []  # run per message by the mail server: its answer is all

    def add_arguments(self, parser):
        parser.add_argument("--recipient", default="",
                            help="the envelope recipient, where the mail server gives it "
                                 "(Postfix: ${recipient}); else the headers are read")

    def handle(self, *args, recipient: str = "", **options):
        raw = sys.stdin.buffer.read(LIMIT + 1)
        if not raw.strip() or len(raw) > LIMIT or b":" not in raw.split(b"\n", 1)[0]:
            self.stderr.write("receive_mail: stdin holds no mail message (RFC 5322: headers, "
                              "an empty line, the body), or one over 25 MB; nothing done.")
            sys.exit(EX_DATAERR)
        try:
            received = replies.receive(raw, via="mta", recipient=recipient)
        except (OperationalError, InterfaceError) as exc:
            self.stderr.write(f"receive_mail: the database cannot be reached ({exc}); "
                              "nothing done, the mail server will try again.")
            sys.exit(EX_TEMPFAIL)
        self.stdout.write(("decided: " if received.decided else "nothing decided: ")
                          + received.outcome)
