"""Each stored response, conversation and item keeps its size: a tenant's are bounded together
(ROUNDHOUSE_TENANT_STORED_BYTES). Rows kept before get theirs from their sealed text."""

from django.db import migrations, models

_SIZES = """
UPDATE inference_storedresponse SET size = octet_length(sealed);
UPDATE inference_conversation SET size = octet_length(sealed);
UPDATE inference_conversationitem SET size = octet_length(sealed);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0002_conversations"),
    ]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="size",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="conversationitem",
            name="size",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="storedresponse",
            name="size",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunSQL(_SIZES, migrations.RunSQL.noop),
    ]
