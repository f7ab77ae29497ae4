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
import os
import secrets
import sqlite3
import threading
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.db import transaction
from django.utils.crypto import salted_hmac

from workflows.models import CheckpointKind, GateRule, Step
from workflows.people.permissions import principals

log = logging.getLogger(__name__)

SALT = "tollgate.live"
TTL = 7 * 86400  # a version older than any page's watch list is only ever a miss


class RedisVersions:
    """Versions in Redis: a ring is one pipelined round trip, a poll's read one MGET."""

    def __init__(self, url: str, prefix: str):
        import redis

        # Redis away costs a poll its shortcut, never a transition its time.
        self.client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        self.prefix = prefix

    def read(self, keys: list[str]) -> list[str]:
        return [v.decode() if v else "" for v in self.client.mget(
            [self.prefix + k for k in keys])]

    def write(self, keys: list[str], value: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.set(self.prefix + key, value, ex=TTL)
        pipe.execute()

    def forget(self, older_than: float) -> int:
        return 0  # Redis expires them (TTL)


class FileVersions:
    """Versions in a small SQLite file of their own (not the database): a ring is one
    unsynced write, a poll's read one indexed SELECT, from any process on the machine."""

    def __init__(self, path: str):
        self.path = path
        self.local = threading.local()

    def db(self) -> sqlite3.Connection:
        # A file replaced or removed under an open connection would be read forever as it
        # was: the file's identity is checked each time (a stat), and a missing one raises.
        inode = os.stat(self.path).st_ino if os.path.exists(self.path) else None
        db = getattr(self.local, "db", None)
        if db is not None and (self.local.pid != os.getpid() or self.local.inode != inode):
            db.close()
            db = None
        if db is None:
            db = sqlite3.connect(self.path, timeout=5, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")  # a lost version is a miss, never a loss
            db.execute("CREATE TABLE IF NOT EXISTS versions (key TEXT PRIMARY KEY, "
                       "value TEXT NOT NULL, at REAL NOT NULL)")
            # The identity as seen before connecting: had the file been replaced since, the
            # next check finds it differs and connects again (a stat taken after connecting
            # could name a new file while the connection reads the old one, forever).
            self.local.db, self.local.pid, self.local.inode = db, os.getpid(), inode
        return db

    def read(self, keys: list[str]) -> list[str]:
        found = dict(self.db().execute(
            f"SELECT key, value FROM versions WHERE key IN ({','.join('?' * len(keys))})",
            keys))
        return [found.get(key, "") for key in keys]

    def write(self, keys: list[str], value: str) -> None:
        now = time.time()
        db = self.db()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT INTO versions VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE "
                           "SET value = excluded.value, at = excluded.at",
                           [(key, value, now) for key in keys])
        finally:
            db.execute("COMMIT")

    def forget(self, older_than: float) -> int:
        return self.db().execute("DELETE FROM versions WHERE at < ?", [older_than]).rowcount


_stores: dict[tuple, object] = {}


def _store():
    """The versions' store the settings name, one per process."""
    where = (settings.TOLLGATE_LIVE_REDIS_URL, settings.TOLLGATE_LIVE_FILE,
             settings.TOLLGATE_LIVE_PREFIX)
    if where not in _stores:
        _stores[where] = (RedisVersions(where[0], where[2]) if where[0]
                          else FileVersions(where[1]))
    return _stores[where]


def forget_old() -> int:
    """Drop versions no page can still be watching (the periodic prune)."""
    try:
        return _store().forget(time.time() - TTL)
    except Exception:
        log.warning("Could not prune page versions", exc_info=True)
        return 0


def run_key(run_id: int) -> str:
    return f"r:{run_id}"


def person_key(user_id: int) -> str:
    return f"u:{user_id}"


def group_key(name: str) -> str:
    return "g:" + hashlib.blake2b(name.encode(), digest_size=8).hexdigest()


ENDED = "ended"  # a session key's version once its session ended


def session_key(session: str) -> str:
    """The key a signed-in session's pages watch besides their own: rung (as ENDED) when
    the session ends, so its streams end and its tokens open no new one."""
    return "s:" + salted_hmac(SALT, session, algorithm="sha256").hexdigest()[:24]


def end_session(sender, request, **kwargs) -> None:
    """A session ended (signed out, or expired by SessionAge): its pages' streams end."""
    session = getattr(getattr(request, "session", None), "session_key", None)
    if session:
        try:
            _store().write([session_key(session)], ENDED)
        except Exception:
            log.warning("Could not end the live streams of a session", exc_info=True)


def ended(keys: list[str], found: dict[str, str]) -> bool:
    """Has the session among a token's `keys` ended (its version read in `found`)?"""
    return any(found.get(key) == ENDED for key in keys if key.startswith("s:"))


def inbox_keys(user) -> list[str]:
    """What `user`'s inbox changes with: themselves, their groups, and each person they
    decide for now, with that person's groups."""
    keys = []
    for person in principals(user):
        keys.append(person_key(person.pk))
        keys.extend(group_key(name) for name in sorted(person.groups))
    return list(dict.fromkeys(keys))


def _seen(keys: list[str]) -> str:
    return digest(_store().read(keys))


def digest(values: list[str]) -> str:
    """What a page saw of its keys: a short digest of their versions, in its keys' order."""
    return hashlib.blake2b("|".join(values).encode(), digest_size=9).hexdigest()


def versions(keys: list[str]) -> dict[str, str]:
    """The versions of many keys in one read ({key: version}, "" for one never rung): the
    events server's look at every key its open pages watch."""
    keys = list(dict.fromkeys(keys))
    return dict(zip(keys, _store().read(keys), strict=True)) if keys else {}


def watch(user_id: int, page: str, keys: list[str]) -> dict:
    """What the page at `page` (its path) sends with its polls: `watch`, the signed keys
    (good for that page only), and `seen`, what they
    held before the page read the database (read first: a change that lands in between
    rings after it and is seen by the next poll). `seen` is empty when the versions cannot
    be read; every poll then reads the database. `events`: where the page opens its stream
    (tollgate.events), if anywhere."""
    token = signing.dumps([user_id, page, keys], salt=SALT, compress=True)
    try:
        return {"watch": token, "seen": _seen(keys),
                "events": settings.TOLLGATE_LIVE_EVENTS_URL,
                "slow": settings.TOLLGATE_LIVE_SLOW_POLL_SECONDS}
    except Exception:  # the versions are a hint; the database answers without them
        log.warning("Page versions cannot be read; open pages poll the database", exc_info=True)
        return {"watch": token, "seen": ""}


def watched(token: str, page: str) -> tuple[int, list[str]] | None:
    """(user id, keys) of a signed, unexpired `watch` made for the page at `page`, or None."""
    try:
        user_id, made_for, keys = signing.loads(token, salt=SALT,
                                                max_age=settings.TOLLGATE_LIVE_MAX_AGE)
    except (signing.BadSignature, ValueError, TypeError):
        return None
    return (user_id, keys) if made_for == page else None


def unchanged(token: str, seen: str, page: str, user_id: int | None = None) -> bool:
    """Has nothing a page watches rung since it saw `seen`? Reads neither the session nor the
    database: the answer says only "nothing changed", and only to the holder of a page's
    own, unexpired token (made for `user_id`, when the caller knows who asks); anything
    else is left to the page's view."""
    if not (token and seen) or (found := watched(token, page)) is None:
        return False
    if user_id is not None and found[0] != user_id:
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
        _store().write(keys, value)
    except Exception:  # a page polls the database when its versions are gone; never fatal
        log.warning("Could not ring %d page versions", len(keys), exc_info=True)


def on_transition(sender, announcements, **kwargs) -> None:
    """As transitions are recorded: their runs' pages, and the inboxes of everyone their
    gates wait on or waited on, are told once their transaction commits. The transitions
    of one transaction (a worker's group commit, a sweeper's batch, a completion and the
    claim chained on it) ring together, their audience read in one query."""
    keys = [run_key(a.run_id) for a in announcements]
    # An ended (or paused, or resumed) run takes its gates out of inboxes, or back.
    runs = [a.run_id for a in announcements if a.run_status != a.previous_status]
    # Their gates' audiences: as the transition read them, else read here.
    gates = []
    for a in (a for a in announcements if a.run_status == a.previous_status):
        for pk in a.gates:
            if pk in a.audiences:
                keys += [group_key(group) if group else person_key(user_id)
                         for group, user_id in a.audiences[pk]]
            else:
                gates.append(pk)
    keys += _audience_keys(runs, gates)
    for announcement in announcements:
        checkpoint = announcement.checkpoint
        if announcement.gates and checkpoint.kind in (CheckpointKind.GATE_REASSIGNED,
                                                      CheckpointKind.GATE_ESCALATED):
            # The rule now names someone else: whom it named before is in the evidence, a
            # group's name or a person's username.
            before = checkpoint.evidence.get("from") or checkpoint.evidence.get("from_group")
            if before:
                keys.append(group_key(before))
                keys += [person_key(pk) for pk in get_user_model().objects.filter(
                    username=before).values_list("pk", flat=True)]
    _rings().extend(keys)


class _Rings(list):
    """The keys a transaction's transitions ring, once it commits."""

    rung = False

    def __call__(self) -> None:
        self.rung = True
        ring(self)


def _rings() -> _Rings:
    """This transaction's rings (registered to run on commit with the first of them, in
    the same savepoint); a rolled-back transaction's go with its other commit hooks."""
    connection = transaction.get_connection()
    here = set(connection.savepoint_ids)
    for sids, hook, _ in connection.run_on_commit:
        if isinstance(hook, _Rings) and sids == here and not hook.rung:
            return hook
    rings = _Rings()
    transaction.on_commit(rings)
    return rings


def _audience_keys(runs: list[int], gates: list[int]) -> list[str]:
    """The keys of the people and groups named by the gate rules of these runs' gates and
    of these gates (each part an index lookup: a UNION, not an OR across the join)."""
    connection = transaction.get_connection()
    named = f"SELECT rule.{connection.ops.quote_name('group')}, rule.user_id FROM " \
            f"{GateRule._meta.db_table} AS rule"
    parts = []
    if runs:
        parts.append(f"{named} JOIN {Step._meta.db_table} AS step ON step.id = rule.step_id "
                     f"WHERE step.run_id IN ({', '.join(['%s'] * len(runs))})")
    if gates:
        parts.append(f"{named} WHERE rule.step_id IN ({', '.join(['%s'] * len(gates))})")
    if not parts:
        return []
    with connection.cursor() as cursor:
        cursor.execute(" UNION ".join(parts), [*runs, *gates])
        rows = cursor.fetchall()
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
