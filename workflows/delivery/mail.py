"""Mail in development: the console shows each message as a person reads it (headers, then
the plain text body, every link whole on its line), not the quoted-printable wire format,
which splits a decision link over two lines with "=". With DEBUG, /dev/mail/ lists what was
sent (the notification records)."""

from __future__ import annotations

from django.core.mail.backends.console import EmailBackend


class ReadableConsoleBackend(EmailBackend):
    def write_message(self, message):
        self.stream.write(f"Subject: {message.subject}\n")
        self.stream.write(f"From: {message.from_email}\n")
        self.stream.write(f"To: {', '.join(message.to)}\n\n")
        self.stream.write(f"{message.body}\n")
        self.stream.write("-" * 79 + "\n")
