"""The goal hierarchy's reads and the closure (GoalLink) that serves them: subtrees and
chains of ancestors are indexed lookups, written once here."""

from __future__ import annotations

from django.db import connection

TABLE = "goals_goal"
LINKS = "goals_goallink"

# The closure computed afresh from the parent column (a migration, or goals written in bulk
# without Goal.save).
RELINK = f"""
    WITH RECURSIVE up(descendant_id, ancestor_id, depth) AS (
        SELECT id, id, 0 FROM {TABLE}
        UNION ALL
        SELECT up.descendant_id, g.parent_id, up.depth + 1
        FROM up JOIN {TABLE} g ON g.id = up.ancestor_id WHERE g.parent_id IS NOT NULL
    )
    INSERT INTO {LINKS} (ancestor_id, descendant_id, depth)
    SELECT ancestor_id, descendant_id, depth FROM up"""


def relink_all() -> None:
    """Rebuild the closure from the parent column (after goals written in bulk)."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {LINKS}")
        cursor.execute(RELINK)


# Any number: the key of the advisory lock every change of the tree's shape takes.
TREE_LOCK = 7_201_911


def lock() -> None:
    """Hold the tree's shape for the rest of the transaction: creates and moves of goals
    take it in turn, so a move's reads of the closure (and the cycle check before it) cannot
    miss another's. SQLite's transactions already take the one write lock at BEGIN."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [TREE_LOCK])


def link(goal_id: int, parent_id: int | None) -> None:
    """A new goal: itself, and its parent's ancestors one level further."""
    lock()
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {LINKS} (ancestor_id, descendant_id, depth) "
                       f"SELECT CAST(%s AS BIGINT), CAST(%s AS BIGINT), 0 UNION ALL "
                       f"SELECT ancestor_id, %s, depth + 1 "
                       f"FROM {LINKS} WHERE descendant_id = %s",
                       [goal_id, goal_id, goal_id, parent_id])


def move(goal_id: int, parent_id: int | None) -> None:
    """A goal given another parent: its subtree leaves its old ancestors and joins the new
    parent's (two statements, in the caller's transaction)."""
    lock()
    with connection.cursor() as cursor:
        cursor.execute(f"""DELETE FROM {LINKS}
            WHERE descendant_id IN (SELECT descendant_id FROM {LINKS} WHERE ancestor_id = %s)
            AND ancestor_id NOT IN (SELECT descendant_id FROM {LINKS} WHERE ancestor_id = %s)
            """, [goal_id, goal_id])
        if parent_id is not None:
            cursor.execute(f"""INSERT INTO {LINKS} (ancestor_id, descendant_id, depth)
                SELECT above.ancestor_id, below.descendant_id, above.depth + below.depth + 1
                FROM {LINKS} above, {LINKS} below
                WHERE above.descendant_id = %s AND below.ancestor_id = %s""",
                           [parent_id, goal_id])


def subtrees_cte(roots: str) -> str:
    """`WITH sub(root_id, id)`: every goal under each root in `roots` (an SQL list or
    subquery), the root included."""
    return (f"WITH sub(root_id, id) AS (SELECT ancestor_id, descendant_id FROM {LINKS} "
            f"WHERE ancestor_id IN ({roots}))")


def ancestor_ids(goal_id: int) -> list[int]:
    """Ids of a goal and all its ancestors, nearest first (one query)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT ancestor_id FROM {LINKS} WHERE descendant_id = %s "
                       "ORDER BY depth", [goal_id])
        return [row[0] for row in cursor.fetchall()]
