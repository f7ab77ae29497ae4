"""Subtree rollups: counts for many goals at once in one recursive query."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.utils.dateparse import parse_datetime
from django.utils.timezone import is_naive, make_aware

from workflows.models import OPEN_RUN_STATUSES, StepStatus

from . import tree


@dataclass(frozen=True)
class Rollup:
    children: int = 0
    descendants: int = 0
    runs_open: int = 0
    runs_completed: int = 0
    runs_failed: int = 0
    gates_waiting: int = 0
    steps_total: int = 0
    steps_done: int = 0
    oldest_gate_since: datetime | None = None

    @property
    def percent_done(self) -> int:
        return round(100 * self.steps_done / self.steps_total) if self.steps_total else 0

    def as_dict(self) -> dict:
        return {
            "child_goals": self.children,
            "descendant_goals": self.descendants,
            "runs_open": self.runs_open,
            "runs_completed": self.runs_completed,
            "runs_failed": self.runs_failed,
            "gates_waiting": self.gates_waiting,
            "steps_total": self.steps_total,
            "steps_done": self.steps_done,
            "percent_done": self.percent_done,
            "oldest_gate_since": self.oldest_gate_since,
        }


def _quoted(values) -> str:
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


# Statuses come from the enums: a renamed status cannot leave the rollup counting nothing.
SQL = """{subtrees},
goal_counts AS (
    SELECT root_id, COUNT(*) - 1 AS descendants FROM sub GROUP BY root_id
),
child_counts AS (
    SELECT parent_id AS root_id, COUNT(*) AS children FROM goals_goal
    WHERE parent_id IN ({ids}) GROUP BY parent_id
),
run_counts AS (
    SELECT sub.root_id, COUNT(*) AS runs_open, SUM(r.steps_total) AS steps_total,
        SUM(r.steps_done) AS steps_done
    FROM sub JOIN workflows_run r ON r.goal_id = sub.id
    WHERE r.status IN {open_run} GROUP BY sub.root_id
),
tally_counts AS (
    SELECT sub.root_id, SUM(t.runs_completed) AS runs_completed,
        SUM(t.runs_failed) AS runs_failed, SUM(t.steps_total) AS steps_total,
        SUM(t.steps_done) AS steps_done
    FROM sub JOIN workflows_goaltally t ON t.goal_id = sub.id GROUP BY sub.root_id
),
gate_counts AS (
    -- Gates wait only in open runs; saying so lets the planner start from those runs.
    SELECT sub.root_id, COUNT(*) AS gates_waiting, MIN(s.waiting_since) AS oldest_gate
    FROM sub JOIN workflows_run r ON r.goal_id = sub.id
    JOIN workflows_step s ON s.run_id = r.id
    WHERE s.status = '{waiting}' AND r.status IN {open_run}
    GROUP BY sub.root_id
)
SELECT gc.root_id, COALESCE(cc.children, 0), gc.descendants,
    COALESCE(rc.runs_open, 0), COALESCE(tc.runs_completed, 0), COALESCE(tc.runs_failed, 0),
    COALESCE(wc.gates_waiting, 0),
    COALESCE(rc.steps_total, 0) + COALESCE(tc.steps_total, 0),
    COALESCE(rc.steps_done, 0) + COALESCE(tc.steps_done, 0),
    wc.oldest_gate
FROM goal_counts gc
LEFT JOIN child_counts cc ON cc.root_id = gc.root_id
LEFT JOIN run_counts rc ON rc.root_id = gc.root_id
LEFT JOIN gate_counts wc ON wc.root_id = gc.root_id
LEFT JOIN tally_counts tc ON tc.root_id = gc.root_id
"""


def _as_datetime(value) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    parsed = parse_datetime(str(value))  # SQLite hands back text
    return make_aware(parsed) if parsed and is_naive(parsed) else parsed


def rollups(goal_ids, *, subtrees: bool = True) -> dict[int, Rollup]:
    """Rollup of each goal's whole subtree (or, with `subtrees=False`, of the goal alone),
    keyed by goal id; one query whatever the count."""
    ids = [int(pk) for pk in goal_ids]
    if not ids:
        return {}
    placeholders = ", ".join(["%s"] * len(ids))
    sub = (tree.subtrees_cte(placeholders) if subtrees else
           f"WITH sub(root_id, id) AS (SELECT id, id FROM {tree.TABLE} WHERE id IN "
           f"({placeholders}))")
    sql = SQL.format(
        subtrees=sub, ids=placeholders,
        open_run=_quoted(OPEN_RUN_STATUSES),
        waiting=StepStatus.WAITING_APPROVAL)
    with connection.cursor() as cursor:
        cursor.execute(sql, ids + ids)
        rows = cursor.fetchall()
    result = {pk: Rollup() for pk in ids}
    for row in rows:
        result[row[0]] = Rollup(*[int(v) for v in row[1:9]], _as_datetime(row[9]))
    return result


def family_rollups(parent_id: int, child_ids) -> dict[int, Rollup]:
    """Rollups of a goal and of each of its children (all of them): the goal's is its own
    plus its children's, so its subtree is walked once rather than twice."""
    ids = [int(pk) for pk in child_ids]
    result = rollups(ids)
    own = rollups([parent_id], subtrees=False)[parent_id]
    parts = [result[pk] for pk in ids]
    gates = [p.oldest_gate_since for p in (own, *parts) if p.oldest_gate_since]
    result[parent_id] = Rollup(
        children=len(ids), descendants=sum(p.descendants + 1 for p in parts),
        **{name: getattr(own, name) + sum(getattr(p, name) for p in parts)
           for name in ("runs_open", "runs_completed", "runs_failed", "gates_waiting",
                        "steps_total", "steps_done")},
        oldest_gate_since=min(gates, default=None))
    return result


def rollup(goal_id: int) -> Rollup:
    """Rollup of one goal's subtree."""
    return rollups([goal_id])[goal_id]


FOLD_BATCH = 5_000  # tally changes per statement
TALLY_COUNTS = ("runs_completed", "runs_failed", "steps_total", "steps_done")
DAY_COUNTS = ("completed", "failed")


def fold_tallies() -> int:
    """Fold the goals' tally changes into one row per goal, so rollups read few rows (the
    periodic fold_goal_tallies task, with fold_days). Returns how many changes were folded.

    Each batch is deleted and added to the folded rows in one transaction; the changes a
    batch deletes are exactly the ones it adds, so a fold racing another, or a transition
    adding a change, loses and repeats nothing."""
    return _fold("workflows_goaltally", ("goal_id",), TALLY_COUNTS, [f"(goal_id) WHERE {_flag()}"])


def fold_days() -> int:
    """Fold the progress report's day changes (RunDay) into one row per day, spec and goal,
    as fold_tallies folds tallies. Returns how many changes were folded."""
    flag = _flag()
    return _fold("workflows_runday", ("day", "spec_name", "goal_id"), DAY_COUNTS,
                 [f"(day, spec_name, goal_id) WHERE ({flag} AND goal_id IS NOT NULL)",
                  f"(day, spec_name) WHERE ({flag} AND goal_id IS NULL)"])


def _flag() -> str:
    """A unique index's `folded` predicate, as each database writes it."""
    return "folded" if connection.vendor == "postgresql" else "folded = 1"


def _fold(table: str, keys: tuple, counts: tuple, targets: list[str]) -> int:
    """Fold `table`'s change rows into its folded rows, a batch per transaction. `targets`:
    the ON CONFLICT targets of the folded rows' unique indexes, the last for rows whose
    last key is NULL when there are two."""
    folded = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE NOT folded "
                f"ORDER BY id LIMIT %s) RETURNING {', '.join(keys + counts)}", [FOLD_BATCH])
            changes = cursor.fetchall()
            sums: dict[tuple, list[int]] = {}
            for row in changes:
                total = sums.setdefault(tuple(row[:len(keys)]), [0] * len(counts))
                for i, value in enumerate(row[len(keys):]):
                    total[i] += value
            # Key order: two folds at once lock the folded rows in the same order.
            rows = sorted(sums.items(), key=lambda item: [(v is None, str(v)) for v in item[0]])
            for target, part in zip(targets, _by_last_key(rows, len(targets)), strict=True):
                if not part:
                    continue
                values = "(" + "%s, " * (len(keys) + len(counts)) + "TRUE)"
                cursor.execute(
                    f"INSERT INTO {table} ({', '.join(keys + counts)}, folded) VALUES "
                    + ", ".join([values] * len(part))
                    + f" ON CONFLICT {target} DO UPDATE SET "
                    + ", ".join(f"{name} = {table}.{name} + excluded.{name}" for name in counts),
                    [value for key, total in part for value in (*key, *total)])
        folded += len(changes)
        if len(changes) < FOLD_BATCH:
            return folded


def _by_last_key(rows: list, parts: int) -> list[list]:
    """The rows as one part, or as two: those whose last key is set, then those where it is
    NULL (each has its own unique index)."""
    if parts == 1:
        return [rows]
    return [[r for r in rows if r[0][-1] is not None], [r for r in rows if r[0][-1] is None]]
