"""Entities record the model of their vector, so a switch to another model of the same size
re-embeds them (maintenance.embed_entities)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rag", "0012_uploads"),
    ]

    operations = [
        migrations.AddField(
            model_name="entity",
            name="embedding_model",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
    ]
