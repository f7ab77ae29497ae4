"""The audit trail refuses changes in the database itself: on PostgreSQL a trigger refuses
UPDATE and DELETE of checkpoints and seals (retention's own deletion, in a transaction that
says so with `tollgate.retention`, excepted); on SQLite one refuses UPDATE. What a database
user does after disabling them is what the chain and its seals find (workflows.audit).

SQLite drops a table's triggers when a migration remakes the table: a later migration that
changes workflows_checkpoint or workflows_auditseal on SQLite must create them again."""

from django.db import migrations

TABLES = ("workflows_checkpoint", "workflows_auditseal")

POSTGRESQL = [
    """CREATE FUNCTION tollgate_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'workflows_checkpoint'
                AND current_setting('tollgate.retention', true) = 'on' THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END $$""",
    *(f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
      "FOR EACH ROW EXECUTE FUNCTION tollgate_append_only()" for table in TABLES),
]
POSTGRESQL_DROP = [*(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}"
                     for table in TABLES), "DROP FUNCTION IF EXISTS tollgate_append_only()"]
SQLITE = [f"CREATE TRIGGER {table}_append_only BEFORE UPDATE ON {table} BEGIN "
          f"SELECT RAISE(ABORT, '{table} is append-only: UPDATE refused'); END"
          for table in TABLES]
SQLITE_DROP = [f"DROP TRIGGER IF EXISTS {table}_append_only" for table in TABLES]


def create(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for statement in POSTGRESQL if vendor == "postgresql" else SQLITE:
        schema_editor.execute(statement, params=None)


def drop(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for statement in POSTGRESQL_DROP if vendor == "postgresql" else SQLITE_DROP:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0043_audit_seals"),
    ]

    operations = [migrations.RunPython(create, drop)]
