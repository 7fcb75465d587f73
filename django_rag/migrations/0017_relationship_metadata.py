"""Relationships carry metadata (a JSON object, like entities), set by the extractors."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_rag", "0016_vector_index_type")]

    operations = [
        migrations.AddField(
            model_name="relationship",
            name="metadata",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
