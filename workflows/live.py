"""What open pages poll for: versions kept outside the database, rung when something changes.

An open inbox watches a key for its viewer and each of their groups (and for each person
they decide for while that person is away); an open run page watches its run. A committed
transition rings the keys of its run and of the people its gates wait on, and a change of a
person's groups or away period rings theirs. A poll sends the page's signed list of keys
(`watch`) and what it saw of them (`seen`); when nothing it watches has rung, `unchanged`
answers without the session or the database (the WSGI entry asks it before Django does),
and otherwise the page's view reads the database as before.

Every ring writes a fresh value, never an increment: two rings at once cannot hide each
other. The versions are a hint: a lost one (the cache flushed, Redis away) makes the page
read the database, and nothing is lost.
"""

from __future__ import annotations

import hashlib
import logging
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.cache import caches
from django.db import transaction

from workflows.models import CheckpointKind, GateRule
from workflows.permissions import principals

log = logging.getLogger(__name__)

SALT = "tollgate.live"


def _cache():
    return caches["live"]


def run_key(run_id: int) -> str:
    return f"r:{run_id}"


def person_key(user_id: int) -> str:
    return f"u:{user_id}"


def group_key(name: str) -> str:
    return "g:" + hashlib.blake2b(name.encode(), digest_size=8).hexdigest()


def inbox_keys(user) -> list[str]:
    """What `user`'s inbox changes with: themselves, their groups, and each person they
    decide for now, with that person's groups."""
    keys = []
    for person in principals(user):
        keys.append(person_key(person.pk))
        keys.extend(group_key(name) for name in sorted(person.groups))
    return list(dict.fromkeys(keys))


def _seen(keys: list[str]) -> str:
    values = _cache().get_many(keys)
    return hashlib.blake2b("|".join(str(values.get(k, "")) for k in keys).encode(),
                           digest_size=9).hexdigest()


def watch(user_id: int, keys: list[str]) -> dict:
    """What a page sends with its polls: `watch`, the signed keys, and `seen`, what they
    held before the page read the database (read first: a change that lands in between
    rings after it and is seen by the next poll). `seen` is empty when the versions cannot
    be read; every poll then reads the database."""
    token = signing.dumps([user_id, keys], salt=SALT, compress=True)
    try:
        return {"watch": token, "seen": _seen(keys)}
    except Exception:  # the versions are a hint; the database answers without them
        log.warning("Page versions cannot be read; open pages poll the database", exc_info=True)
        return {"watch": token, "seen": ""}


def watched(token: str) -> tuple[int, list[str]] | None:
    """(user id, keys) of a page's signed, unexpired `watch`, or None."""
    try:
        user_id, keys = signing.loads(token, salt=SALT, max_age=settings.TOLLGATE_LIVE_MAX_AGE)
    except (signing.BadSignature, ValueError, TypeError):
        return None
    return user_id, keys


def unchanged(token: str, seen: str) -> bool:
    """Has nothing a page watches rung since it saw `seen`? Reads neither the session nor the
    database: the answer says only "nothing changed", and only to the holder of a page's
    own, unexpired token; anything else is left to the page's view."""
    if not (token and seen) or (found := watched(token)) is None:
        return False
    try:
        return _seen(found[1]) == seen
    except Exception:
        return False


def ring(keys) -> None:
    """Tell the pages watching these keys that something changed (after the change commits)."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return
    value = secrets.token_hex(6)
    try:
        _cache().set_many(dict.fromkeys(keys, value))
    except Exception:  # a page polls the database when its versions are gone; never fatal
        log.warning("Could not ring %d page versions", len(keys), exc_info=True)


def on_transition(sender, announcement, **kwargs) -> None:
    """After a transition commits: its run's page, and the inboxes of everyone its gates wait
    on or waited on, are told."""
    keys = [run_key(announcement.run_id)]
    rules = None
    if announcement.run_status != announcement.previous_status:
        # An ended (or paused, or resumed) run takes its gates out of inboxes, or back.
        rules = GateRule.objects.filter(step__run_id=announcement.run_id)
    elif announcement.gates:
        rules = GateRule.objects.filter(step_id__in=announcement.gates)
    if rules is not None:
        keys += _audience_keys(rules.values_list("group", "user_id").distinct())
    if announcement.gates:
        checkpoint = announcement.checkpoint
        if checkpoint.kind in (CheckpointKind.GATE_REASSIGNED, CheckpointKind.GATE_ESCALATED):
            # The rule now names someone else: whom it named before is in the evidence, a
            # group's name or a person's username.
            before = checkpoint.evidence.get("from") or checkpoint.evidence.get("from_group")
            if before:
                keys.append(group_key(before))
                keys += [person_key(pk) for pk in get_user_model().objects.filter(
                    username=before).values_list("pk", flat=True)]
    ring(keys)


def _audience_keys(rows) -> list[str]:
    return [group_key(group) if group else person_key(user_id) for group, user_id in rows]


def on_groups_changed(sender, instance, action, pk_set=None, reverse=False, **kwargs) -> None:
    """A person joined or left a group (from either side of the relation): rung once the
    change commits, so that a poll never reads the ring before the rows."""
    if action not in ("post_add", "post_remove", "pre_clear"):
        return
    if not reverse:
        people = [instance.pk]
    elif action == "pre_clear":  # everyone in the group is about to leave it
        people = list(instance.user_set.values_list("pk", flat=True))
    else:
        people = list(pk_set or ())
    keys = [person_key(pk) for pk in people]
    transaction.on_commit(lambda: ring(keys))


def on_preference_changed(sender, instance, **kwargs) -> None:
    """A person's away period or delegate changed: their inbox and their delegate's."""
    keys = [person_key(instance.user_id)] + (
        [person_key(instance.delegate_id)] if instance.delegate_id else [])
    transaction.on_commit(lambda: ring(keys))
