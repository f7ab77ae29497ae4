"""The goal hierarchy's recursive queries, written once: ancestors and subtrees."""

from __future__ import annotations

import json

from django.db import connection
from django.db.models.expressions import RawSQL

TABLE = "goals_goal"


def subtrees_cte(roots: str) -> str:
    """`WITH RECURSIVE sub(root_id, id)`: every goal under each root in `roots` (an SQL
    list or subquery), the root included."""
    return f"""WITH RECURSIVE sub(root_id, id) AS (
        SELECT id, id FROM {TABLE} WHERE id IN ({roots})
        UNION ALL
        SELECT sub.root_id, g.id FROM {TABLE} g JOIN sub ON g.parent_id = sub.id
    )"""


def subtree_by(root_id: int, column: str) -> dict[object, list[int]]:
    """The ids of a goal and all its descendants, grouped by a column's value: one recursive
    query, its ids gathered in the database (a list per value, not a row per goal)."""
    gather = "array_agg(id)" if connection.vendor == "postgresql" else "json_group_array(id)"
    column = connection.ops.quote_name(column)
    with connection.cursor() as cursor:
        cursor.execute(f"""WITH RECURSIVE sub(id, value) AS (
            SELECT id, {column} FROM {TABLE} WHERE id = %s
            UNION ALL
            SELECT g.id, g.{column} FROM {TABLE} g JOIN sub ON g.parent_id = sub.id
        ) SELECT value, {gather} FROM sub GROUP BY value""", [root_id])
        return {value: ids if isinstance(ids, list) else json.loads(ids)
                for value, ids in cursor.fetchall()}


def among(ids: list[int]) -> RawSQL:
    """A subquery of these ids, for `pk__in=` and `goal_id__in=`, bound as one parameter
    (however many there are) so that a subtree is walked once and then only looked up."""
    if connection.vendor == "postgresql":
        # An array literal, written once: the driver would adapt each id on its own.
        return RawSQL("SELECT unnest(%s::bigint[])", ["{" + ",".join(map(str, ids)) + "}"])
    return RawSQL("SELECT value FROM json_each(%s)", [json.dumps(list(ids))])


def ancestor_ids(goal_id: int) -> list[int]:
    """Ids of a goal and all its ancestors, nearest first (one recursive query)."""
    sql = f"""
        WITH RECURSIVE up(id, parent_id, depth) AS (
            SELECT id, parent_id, 0 FROM {TABLE} WHERE id = %s
            UNION ALL
            SELECT g.id, g.parent_id, up.depth + 1 FROM {TABLE} g JOIN up ON g.id = up.parent_id
            WHERE up.depth < 10000
        )
        SELECT id FROM up ORDER BY depth
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [goal_id])
        return [row[0] for row in cursor.fetchall()]
