import django.db.models.deletion
from django.db import migrations, models

# Each goal's folded tally starts as what its pruned runs left and its finished runs count
# (cancelled ones count for nothing; open ones are counted live).
FOLD_EXISTING = """
INSERT INTO workflows_goaltally (goal_id, runs_completed, runs_failed, steps_total,
                                 steps_done, folded)
SELECT g.id,
    g.pruned_runs_completed + COALESCE(r.completed, 0),
    g.pruned_runs_failed + COALESCE(r.failed, 0),
    g.pruned_steps_total + COALESCE(r.steps_total, 0),
    g.pruned_steps_done + COALESCE(r.steps_done, 0),
    TRUE
FROM goals_goal g LEFT JOIN (
    SELECT goal_id,
        SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END) AS completed,
        SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed,
        SUM(steps_total) AS steps_total, SUM(steps_done) AS steps_done
    FROM workflows_run WHERE status IN ('completed', 'failed') GROUP BY goal_id
) r ON r.goal_id = g.id
WHERE r.goal_id IS NOT NULL OR g.pruned_runs_completed + g.pruned_runs_failed > 0
"""


class Migration(migrations.Migration):

    dependencies = [
        ("goals", "0002_pruned_counters"),
        ("workflows", "0028_run_step_counts"),
    ]

    operations = [
        migrations.CreateModel(
            name="GoalTally",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("runs_completed", models.IntegerField(default=0)),
                ("runs_failed", models.IntegerField(default=0)),
                ("steps_total", models.BigIntegerField(default=0)),
                ("steps_done", models.BigIntegerField(default=0)),
                ("folded", models.BooleanField(default=False)),
                ("goal", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                           related_name="+", to="goals.goal")),
            ],
            options={
                "constraints": [models.UniqueConstraint(
                    condition=models.Q(("folded", True)), fields=("goal",),
                    name="goal_tally_one_folded_per_goal")],
            },
        ),
        migrations.RunSQL(FOLD_EXISTING, migrations.RunSQL.noop),
    ]
