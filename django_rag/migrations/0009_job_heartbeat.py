from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rag", "0008_term_score_bounds"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="runner",
            field=models.CharField(blank=True, default="", max_length=10),
        ),
        migrations.AddField(
            model_name="job",
            name="worker",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.AddField(
            model_name="job",
            name="started_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="heartbeat_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="attempts",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                fields=["runner", "status", "created_at"], name="django_rag_job_queue_idx"
            ),
        ),
    ]
