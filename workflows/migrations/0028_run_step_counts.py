from django.db import migrations, models

# Runs made before the counters count their steps once, here; the engine keeps them after.
COUNT_STEPS = """
UPDATE workflows_run SET
    steps_total = (SELECT COUNT(*) FROM workflows_step s WHERE s.run_id = workflows_run.id),
    steps_done = (SELECT COUNT(*) FROM workflows_step s WHERE s.run_id = workflows_run.id
                  AND s.status IN ('completed', 'skipped'))
"""


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0027_run_search_text"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="steps_done",
            field=models.PositiveIntegerField(default=0, editable=False),
        ),
        migrations.AddField(
            model_name="run",
            name="steps_total",
            field=models.PositiveIntegerField(default=0, editable=False),
        ),
        migrations.RunSQL(COUNT_STEPS, migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(("steps_done__lte", models.F("steps_total"))),
                name="run_steps_done_within_total"),
        ),
    ]
