"""On SQLite, the run search's "contains" served by an FTS5 trigram index (PostgreSQL has
its trigram index since 0027): a table over the runs' search_text, kept by triggers."""

from django.db import migrations

CREATE = [
    "CREATE VIRTUAL TABLE run_search USING fts5(search_text, content='workflows_run', "
    "content_rowid='id', tokenize='trigram')",
    "INSERT INTO run_search(run_search) VALUES ('rebuild')",
    "CREATE TRIGGER run_search_insert AFTER INSERT ON workflows_run BEGIN "
    "INSERT INTO run_search(rowid, search_text) VALUES (new.id, new.search_text); END",
    "CREATE TRIGGER run_search_delete AFTER DELETE ON workflows_run BEGIN "
    "INSERT INTO run_search(run_search, rowid, search_text) "
    "VALUES ('delete', old.id, old.search_text); END",
    # Only the columns search_text is made of: a status change writes nothing here.
    "CREATE TRIGGER run_search_update AFTER UPDATE OF title, idempotency_key, ref, spec_name "
    "ON workflows_run BEGIN "
    "INSERT INTO run_search(run_search, rowid, search_text) "
    "VALUES ('delete', old.id, old.search_text); "
    "INSERT INTO run_search(rowid, search_text) VALUES (new.id, new.search_text); END",
]
DROP = ["DROP TRIGGER IF EXISTS run_search_update", "DROP TRIGGER IF EXISTS run_search_delete",
        "DROP TRIGGER IF EXISTS run_search_insert", "DROP TABLE IF EXISTS run_search"]


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in CREATE:
            schema_editor.execute(statement)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0037_run_days"),
    ]

    operations = [migrations.RunPython(create, drop)]
