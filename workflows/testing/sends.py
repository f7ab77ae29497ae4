"""What Tollgate sends, kept in memory: mail (every message Django would hand its mail
backend), Slack and Teams (a recording platform in place of each, posting to the channel
of each approval group), and push (each payload, with the person it is for)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from unittest import mock


@dataclass
class Sends:
    """What was sent within `recorded_sends()`: mail, chat (platform, what, where, the
    message) and push (the person, the payload)."""

    mail: list = field(default_factory=list)  # django.core.mail.EmailMessage
    chat: list[tuple[str, str, str, object]] = field(default_factory=list)
    push: list[tuple[object, dict]] = field(default_factory=list)  # (user, payload)

    def mail_to(self, address: str) -> list:
        return [m for m in self.mail if address in m.to]

    def chat_on(self, platform: str) -> list[tuple[str, str, object]]:
        """(what: post, update, remind, tell or dm; where; the message) on one platform."""
        return [(what, where, message) for name, what, where, message in self.chat
                if name == platform]


class RecordingChat:
    """A chat platform that keeps what it is asked to post (see chat.base.ChatProvider)."""

    def __init__(self, name: str, channels: dict[str, str], sends: Sends):
        self.name, self.label, self.channels, self._sends = name, name.title(), channels, sends
        self._refs: dict[tuple[str, int, int], str] = {}

    def _keep(self, what: str, where: str, message) -> None:
        self._sends.chat.append((self.name, what, where, message))

    def post(self, channel, message):
        ref = f"{self.name}-{len(self._sends.chat)}"
        self._refs[(channel, message.step_id, message.attempt)] = ref
        self._keep("post", channel, message)
        return ref

    def find(self, channel, step_id, attempt):
        return self._refs.get((channel, step_id, attempt))

    def update(self, channel, ref, message):
        self._keep("update", channel, message)

    def remind(self, channel, ref, message):
        self._keep("remind", channel, message)

    def tell(self, press, text):
        self._keep("tell", press.chat_user, text)

    def dm(self, chat_user, text):
        self._keep("dm", chat_user, text)


@contextmanager
def recorded_sends(chat_channels: dict[str, str] | None = None) -> Iterator[Sends]:
    """Within the block Tollgate sends (mail too, whatever TOLLGATE_NOTIFY says) and
    nothing leaves the process: mail, chat and push are kept in the `Sends` yielded.
    `chat_channels` (approval group -> channel) turns on a recording Slack and Teams; push
    is on for every browser subscribed."""
    from django.core.mail import EmailMessage
    from django.test.utils import override_settings

    from workflows.chat import providers
    from workflows.delivery import push

    sends = Sends()

    def mailed(message, fail_silently=False):
        sends.mail.append(message)
        return 1

    def pushed(subscription, payload):
        sends.push.append((subscription.user, payload))
        return True

    platforms = [RecordingChat(name, dict(chat_channels), sends)
                 for name in ("slack", "teams")] if chat_channels else []
    with ExitStack() as stack:
        stack.enter_context(override_settings(TOLLGATE_NOTIFY=True))
        stack.enter_context(mock.patch.object(EmailMessage, "send", mailed))
        stack.enter_context(mock.patch.object(push, "send", pushed))
        stack.enter_context(mock.patch.object(push, "enabled", lambda: True))
        stack.enter_context(mock.patch.object(providers, "enabled", lambda: platforms))
        stack.enter_context(mock.patch.object(providers, "any_enabled",
                                              lambda: bool(platforms)))
        stack.enter_context(mock.patch.object(providers, "get", lambda name: next(
            (p for p in platforms if p.name == name), None)))
        yield sends


def deliver_outbox() -> int:
    """Deliver now what the transitions so far owe (mail, webhooks, chat, push, parent and
    child runs), as the consumers would; how many messages were delivered."""
    from django.utils import timezone

    from workflows.delivery import outbox
    from workflows.models import OutboxMessage
    from workflows.timing import clock

    # An outbox row is stamped due by the machine's clock, which a clock held still at the
    # block's start falls behind.
    now = max(clock.now(), timezone.now())
    done = 0
    for message_id in OutboxMessage.objects.filter(done_at__isnull=True).order_by(
            "pk").values_list("pk", flat=True):
        done += outbox.deliver(message_id, now=now) == "done"
    return done
