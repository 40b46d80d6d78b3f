from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('models_registry', '0008_version_weights_uri'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='prefix_caching',
            field=models.BooleanField(default=True),
        ),
    ]
