from django.db import migrations


class Migration(migrations.Migration):
    """What pruned runs left behind now lives in the goals' folded tallies (copied there by
    workflows 0029, which also counts the finished runs still kept)."""

    dependencies = [
        ("goals", "0002_pruned_counters"),
        ("workflows", "0029_goal_tally"),
    ]

    operations = [
        migrations.RemoveField(model_name="goal", name="pruned_runs_completed"),
        migrations.RemoveField(model_name="goal", name="pruned_runs_failed"),
        migrations.RemoveField(model_name="goal", name="pruned_steps_done"),
        migrations.RemoveField(model_name="goal", name="pruned_steps_total"),
    ]
