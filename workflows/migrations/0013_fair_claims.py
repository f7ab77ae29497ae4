"""Fair claims: runs carry their priority rank, max_parallel, claim time and when a worker
last served them; runs already open get their claim time from their ready steps."""

import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def claim_times(apps, schema_editor):
    Run = apps.get_model("workflows", "Run")
    Step = apps.get_model("workflows", "Step")
    now = django.utils.timezone.now()
    Run.objects.update(served_at=models.F("created_at"))
    open_runs = Run.objects.filter(status__in=["open", "running"])
    held = Step.objects.filter(status="failed", continue_on_failure=False).values("run_id")
    ready = Step.objects.filter(kind="run", status="pending", waiting_on=0).values("run_id")
    open_runs.filter(pk__in=ready).exclude(pk__in=held).update(claimable_at=now)
    retrying = (Step.objects.filter(status="retrying", run__claimable_at__isnull=True,
                                    run__status__in=["open", "running"])
                .values("run_id").annotate(due=models.Min("retry_after")))
    for row in retrying:
        Run.objects.filter(pk=row["run_id"]).update(claimable_at=row["due"] or now)


class Migration(migrations.Migration):

    dependencies = [
        ('goals', '0001_initial'),
        ('workflows', '0012_wait_steps'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='step',
            name='step_run_status_idx',
        ),
        migrations.AddField(
            model_name='run',
            name='claimable_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='max_parallel',
            field=models.PositiveIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='priority_rank',
            field=models.GeneratedField(db_persist=True, expression=models.Case(models.When(priority='low', then=0), models.When(priority='normal', then=1), models.When(priority='high', then=2), models.When(priority='critical', then=3), default=1), output_field=models.SmallIntegerField()),
        ),
        migrations.AddField(
            model_name='run',
            name='served_at',
            field=models.DateTimeField(default=django.utils.timezone.now, editable=False),
        ),
        migrations.AlterField(
            model_name='checkpoint',
            name='actor',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='checkpoint',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='checkpoints', to='workflows.run'),
        ),
        migrations.AddIndex(
            model_name='checkpoint',
            index=models.Index(condition=models.Q(('actor__isnull', False)), fields=['actor'], name='checkpoint_actor_idx'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('claimable_at__isnull', False)), fields=['-priority_rank', 'served_at'], name='run_claim_order_idx'),
        ),
        migrations.AddIndex(
            model_name='step',
            index=models.Index(condition=models.Q(('kind', 'run'), ('status', 'pending'), ('waiting_on', 0)), fields=['run', 'index'], name='step_ready_idx'),
        ),
        migrations.RunPython(claim_times, migrations.RunPython.noop),
    ]
