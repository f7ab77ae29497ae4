import django.db.models.deletion
from django.db import migrations, models

SETTLED = ("completed", "skipped")


def fill_edges(apps, schema_editor):
    """Give existing steps their dependents and unsettled-dependency counts."""
    Step = apps.get_model("workflows", "Step")
    run_ids = Step.objects.values_list("run_id", flat=True).distinct()
    for run_id in run_ids.iterator():
        steps = {s.key: s for s in Step.objects.filter(run_id=run_id)}
        for step in steps.values():
            step.dependents = [s.key for s in steps.values() if step.key in s.depends_on]
            step.waiting_on = sum(
                1 for dep in step.depends_on
                if not (steps[dep].status in SETTLED
                        or (steps[dep].status == "failed" and steps[dep].continue_on_failure)))
        Step.objects.bulk_update(steps.values(), ["dependents", "waiting_on"], batch_size=500)


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0003_deadlines_and_notifications'),
    ]

    operations = [
        migrations.AddField(
            model_name='step',
            name='dependents',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='step',
            name='waiting_on',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name='step',
            index=models.Index(fields=['run', 'status'], name='step_run_status_idx'),
        ),
        # Ready steps are found within a run now, by the frontier and the indexes above.
        migrations.RemoveIndex(
            model_name='step',
            name='step_ready_idx',
        ),
        # Ordering by run_id, not run, keeps Run's own ordering (a join) out of step queries.
        migrations.AlterModelOptions(
            name="checkpoint",
            options={"ordering": ["run_id", "seq"]},
        ),
        migrations.AlterModelOptions(
            name="step",
            options={"ordering": ["run_id", "index"]},
        ),
        migrations.AlterField(
            model_name='step',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='workflows.run'),
        ),
        migrations.AddIndex(
            model_name='step',
            index=models.Index(condition=models.Q(('status__in', ['running', 'retrying', 'waiting_approval', 'blocked']), models.Q(('continue_on_failure', False), ('status', 'failed')), models.Q(('status', 'pending'), ('waiting_on', 0), models.Q(('kind', 'approval'), ('rung_at__isnull', True), _connector='OR')), _connector='OR'), fields=['run', 'index'], name='step_frontier_idx'),
        ),
        migrations.RunPython(fill_edges, migrations.RunPython.noop, elidable=True),
    ]
