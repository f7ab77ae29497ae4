"""The decisions join the audit trail's refusals: on PostgreSQL and SQLite a decision row
(workflows_approval) refuses UPDATE, and DELETE outside retention. On PostgreSQL retention's
deletions are told apart by the run's tombstone seal, written in the same transaction and
signed with the deployment's key, no longer by a session setting that any session could set:
a row deleted under a forged tombstone is a seal that does not verify. What a database user
does after disabling the triggers is what the chain (each decision's digest in its
checkpoint), the seals and the seal chain's head kept outside the database find."""

from django.db import migrations

POSTGRESQL = [
    """CREATE OR REPLACE FUNCTION tollgate_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        run bigint;
    BEGIN
        IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'workflows_checkpoint' THEN
            run := OLD.run_id;
        ELSIF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'workflows_approval' THEN
            SELECT run_id INTO run FROM workflows_step WHERE id = OLD.step_id;
        END IF;
        IF run IS NOT NULL AND EXISTS (SELECT 1 FROM workflows_auditseal
                                       WHERE run_id = run AND seq = 0) THEN
            RETURN OLD;  -- retention: the run was signed off as deleted first
        END IF;
        RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END $$""",
    "CREATE TRIGGER workflows_approval_append_only BEFORE UPDATE OR DELETE ON "
    "workflows_approval FOR EACH ROW EXECUTE FUNCTION tollgate_append_only()",
]
POSTGRESQL_DROP = ["DROP TRIGGER IF EXISTS workflows_approval_append_only ON workflows_approval"]
SQLITE = [
    "CREATE TRIGGER workflows_approval_append_only BEFORE UPDATE ON workflows_approval BEGIN "
    "SELECT RAISE(ABORT, 'workflows_approval is append-only: UPDATE refused'); END",
    "CREATE TRIGGER workflows_approval_no_delete BEFORE DELETE ON workflows_approval "
    "WHEN NOT EXISTS (SELECT 1 FROM tollgate_audit_unlock) BEGIN "
    "SELECT RAISE(ABORT, 'workflows_approval is append-only: DELETE refused'); END",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS workflows_approval_append_only",
               "DROP TRIGGER IF EXISTS workflows_approval_no_delete"]


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
        ("workflows", "0057_fewer_run_and_step_indexes"),
    ]

    operations = [migrations.RunPython(create, drop)]
