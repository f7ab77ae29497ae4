"""Replies through a hosted mail service (Mailgun, Postmark, SendGrid, Amazon SES, ...):
django-anymail checks the service's webhook (its shared secret, and the service's own
signature where it signs) and hands each message to `on_inbound`, which is the same handler a
mail server's pipe reaches. An error answers 500, so the service posts the message again."""

from __future__ import annotations

from . import replies


def on_inbound(sender, event, esp_name: str, **kwargs) -> None:
    message = event.message
    if message is None:
        return
    replies.receive(message.as_bytes(), via=f"anymail:{esp_name.lower()}"[:40],
                    recipient=message.envelope_recipient or "", message=message)
