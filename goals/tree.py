"""The goal hierarchy's recursive queries, written once: ancestors and subtrees."""

from __future__ import annotations

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


def subtree(root_id: int) -> RawSQL:
    """The ids of a goal and all its descendants, for `pk__in=` and `goal_id__in=`."""
    return RawSQL(f"{subtrees_cte('%s')} SELECT id FROM sub", [root_id])


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
