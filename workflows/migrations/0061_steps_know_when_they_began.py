# A step knows whether its attempt began (batches: not until its turn); older rows count as begun.

import django.db.models.functions.datetime
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0060_runs_know_their_schedule'),
    ]

    operations = [
        migrations.AddField(
            model_name='step',
            name='began_at',
            field=models.DateTimeField(blank=True, db_default=django.db.models.functions.datetime.Now(), default=django.utils.timezone.now, null=True),
        ),
    ]
