import django.db.models.functions.text
from django.db import migrations, models


def trigram_index(apps, schema_editor):
    """On PostgreSQL, the run search's "contains" served by a trigram index; SQLite scans."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        schema_editor.execute("CREATE INDEX run_search_trgm_idx ON workflows_run "
                              "USING gin (search_text gin_trgm_ops)")


def drop_trigram_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS run_search_trgm_idx")


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0026_workers_and_periodic_runs"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="search_text",
            field=models.GeneratedField(
                db_persist=True,
                expression=django.db.models.functions.text.Lower(
                    django.db.models.functions.text.Concat(
                        "title", models.Value(" "), "idempotency_key", models.Value(" "),
                        "ref", models.Value(" "), "spec_name",
                        output_field=models.TextField())),
                output_field=models.TextField()),
        ),
        migrations.RunPython(trigram_index, drop_trigram_index),
    ]
