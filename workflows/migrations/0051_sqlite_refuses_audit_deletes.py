"""On SQLite too, the audit trail refuses DELETE in the database: checkpoints, seals and
timestamps are deleted only while a row sits in `tollgate_audit_unlock`, which retention
writes inside its own transaction (invisible to every other connection, SQLite having one
writer) and `manage.py flush` writes around its own (workflows/management/commands/flush.py).
SQLite has no session setting such as PostgreSQL's `tollgate.retention`; a table of its own,
unknown to Django's models, is the nearest thing. What a database user does after dropping
the triggers is what the chain and its seals find."""

from django.db import migrations

TABLES = ("workflows_checkpoint", "workflows_auditseal", "workflows_audittimestamp")
UNLOCK = "tollgate_audit_unlock"
SQLITE = [f"CREATE TABLE IF NOT EXISTS {UNLOCK} (why TEXT NOT NULL)",
          *(f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
            f"WHEN NOT EXISTS (SELECT 1 FROM {UNLOCK}) BEGIN "
            f"SELECT RAISE(ABORT, '{table} is append-only: DELETE refused'); END"
            for table in TABLES)]
SQLITE_DROP = [f"DROP TRIGGER IF EXISTS {table}_no_delete" for table in TABLES]


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE:
            schema_editor.execute(statement, params=None)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in [*SQLITE_DROP, f"DROP TABLE IF EXISTS {UNLOCK}"]:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0050_audit_timestamps"),
    ]

    operations = [migrations.RunPython(create, drop)]
