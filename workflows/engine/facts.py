"""What deciding a gate turns on, for a person and any number of gates, read in one statement:
each gate's rules for its current attempt, who decided that attempt already, the person's
groups, and the people away whose gates the person decides now (with their groups).

The engine reads them under the run's lock before it records a decision; the read model of
the gate as a person sees it (`workflows.reads.gates`) reads the same facts for a page's
gates; both hand them to `permissions.choose_rule`, the one gate rule. One statement, not
four: each of them was an indexed lookup whose cost was the round trip and the ORM's
building, not the database's work.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db import connection

from workflows.engine import sql
from workflows.engine.policy import RULES
from workflows.models import Approval, GateRule, Preference, Step
from workflows.people.permissions import Principal, who_decided


@dataclass
class GateFacts:
    """The facts of one person and some gates (see the module's docstring)."""

    rules: dict[int, list[GateRule]]  # gate id -> its attempt's rules, stage by stage
    decided: dict[int, set[int]]  # gate id -> who decided it (`permissions.who_decided`)
    groups: frozenset[str]
    delegators: list[Principal] = field(default_factory=list)

    def people(self, user) -> list[Principal]:
        """Whom `user` decides as: themselves, then each person away they stand in for."""
        return [Principal(user.pk, user.get_username(), self.groups), *self.delegators]

    def audiences(self, gate_id: int) -> list[tuple[str, int | None]]:
        """(group, person id) that each of the gate's rules names: whose inboxes it is in."""
        return [(rule.group, rule.user_id) for rule in self.rules.get(gate_id, [])]


def read(user, gates: list[Step], now) -> GateFacts:
    """The facts of `user` and `gates` (each with its `attempt` as loaded) at `now`."""
    text = _statement(len(gates))
    ids = [gate.pk for gate in gates]
    moment = connection.ops.adapt_datetimefield_value(now)
    rules: dict[int, list[GateRule]] = {pk: [] for pk in ids}
    pairs: dict[int, list[tuple[int, int | None]]] = {pk: [] for pk in ids}
    groups: set[str] = set()
    away: dict[int, tuple[str, set[str], object]] = {}
    at = _positions()
    with sql.cursor() as cursor:
        cursor.execute(text, [*ids, *ids, user.pk, user.pk, moment, moment])
        rows = cursor.fetchall()
    for row in rows:
        kind = row[0]
        if kind == "r":
            rule = RULES.instance(row, 1)
            rule._state.fields_cache["user"] = _person(rule.user_id, row[at["name"]])
            rules[rule.step_id].append(rule)
        elif kind == "a":
            pairs[row[at["step_id"]]].append((row[at["user_id"]], row[at["id"]]))
        elif kind == "g":
            groups.add(row[at["group"]])
        else:  # "d": a person away who named this user their delegate, once per group
            until = row[at["opened_at"]]
            name, theirs, _ = away.setdefault(row[at["id"]], (
                row[at["name"]], set(), sql._sqlite_datetime(until) if isinstance(until, str)
                else until))
            if row[at["group"]]:
                theirs.add(row[at["group"]])
    for found in rules.values():
        found.sort(key=lambda rule: (rule.order, rule.position))
    delegators = [Principal(pk, name, frozenset(theirs), delegated=True, away_until=until)
                  for pk, (name, theirs, until) in sorted(away.items())]
    return GateFacts(rules, {pk: who_decided(found) for pk, found in pairs.items()},
                     frozenset(groups), delegators)


def _person(pk, name):
    """The rule's person as far as its audience needs (their username), unsaved."""
    if pk is None:
        return None
    User = get_user_model()
    person = User(pk=pk)
    setattr(person, User.USERNAME_FIELD, name)
    return person


@functools.cache
def _positions() -> dict[str, int]:
    """Where each value sits in a row: the rule's columns (after the kind), then a name."""
    names = RULES.attnames
    return {**{name: 1 + i for i, name in enumerate(names)}, "name": 1 + len(names)}


@functools.lru_cache(maxsize=64)
def _statement(count: int) -> str:
    """The UNION of the four reads; each branch fills the rule's columns where its values
    have the same type (a person's id where a rule's id is, a group's name where a rule's
    group is), NULL elsewhere, so the UNION's columns keep the rules' types."""
    User = get_user_model()
    memberships = User.groups.through._meta
    member = sql.qn(memberships.get_field("user").column)
    group_of = sql.qn(memberships.get_field("group").column)
    group_table = sql.qn(User.groups.field.related_model._meta.db_table)
    users, steps = sql.qn(User._meta.db_table), sql.qn(Step._meta.db_table)
    decisions, prefs = sql.qn(Approval._meta.db_table), sql.qn(Preference._meta.db_table)
    username = sql.qn(User._meta.get_field(User.USERNAME_FIELD).column)
    marks = ", ".join(["%s"] * count) or "NULL"

    def row(kind: str, values: dict[str, str], name: str = "NULL") -> str:
        cells = [values.get(attname, "NULL") for attname in RULES.attnames]
        return ", ".join([f"'{kind}'", *cells, name])

    rule_cells = {attname: f"r.{RULES.column(attname)}" for attname in RULES.attnames}
    return " UNION ALL ".join([
        f"SELECT {row('r', rule_cells, f'u.{username}')} FROM {RULES.name} r "
        f"JOIN {steps} s ON s.id = r.step_id AND s.attempt = r.attempt "
        f"LEFT JOIN {users} u ON u.id = r.user_id WHERE r.step_id IN ({marks})",
        f"SELECT {row('a', {'step_id': 'a.step_id', 'user_id': 'a.user_id',
                            'id': 'a.on_behalf_of_id'})} FROM {decisions} a "
        f"JOIN {steps} s ON s.id = a.step_id AND s.attempt = a.attempt "
        f"WHERE a.step_id IN ({marks})",
        f"SELECT {row('g', {'group': 'g.name'})} FROM {group_table} g "
        f"JOIN {sql.qn(memberships.db_table)} m ON m.{group_of} = g.id WHERE m.{member} = %s",
        f"SELECT {row('d', {'id': 'u.id', 'group': 'g.name', 'opened_at': 'p.away_until'},
                      f'u.{username}')} FROM {users} u "
        f"JOIN {prefs} p ON p.user_id = u.id "
        f"LEFT JOIN {sql.qn(memberships.db_table)} m ON m.{member} = u.id "
        f"LEFT JOIN {group_table} g ON g.id = m.{group_of} "
        f"WHERE u.is_active AND p.delegate_id = %s AND p.away_from <= %s "
        f"AND p.away_until > %s",
    ])
