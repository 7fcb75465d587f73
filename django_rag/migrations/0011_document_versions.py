import django.db.models.deletion
import django_rag.models.documents
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rag", "0010_bm25_index"),
    ]

    operations = [
        # Existing documents take versions from the sequence as the column is added: they are
        # all older than any document submitted after the upgrade.
        migrations.RunSQL(
            "CREATE SEQUENCE IF NOT EXISTS django_rag_document_version",
            "DROP SEQUENCE IF EXISTS django_rag_document_version",
        ),
        migrations.AddField(
            model_name="document",
            name="version",
            field=models.BigIntegerField(
                db_default=django_rag.models.documents.NextVersion(), editable=False
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="not_before",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("running", "Running"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("superseded", "Superseded"),
                ],
                default="pending",
                max_length=10,
            ),
        ),
        migrations.CreateModel(
            name="SourceVersion",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("source_id", models.CharField(max_length=512)),
                ("version", models.BigIntegerField()),
                ("deleted", models.BooleanField(default=False)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "collection",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="django_rag.collection",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("collection", "source_id"), name="django_rag_source_version_uniq"
                    )
                ],
            },
        ),
        migrations.AlterField(
            model_name="job",
            name="kind",
            field=models.CharField(
                choices=[
                    ("ingest", "Ingest a document"),
                    ("reembed", "Re-embed chunks"),
                    ("reembed-task", "Re-embed (queued)"),
                    ("embedding-switch", "Switch the embedding model"),
                    ("build-graph", "Build the graph"),
                    ("detect-communities", "Detect communities"),
                    ("summarize-communities", "Summarise communities"),
                    ("run-evaluation", "Run an evaluation"),
                    ("generate-test-cases", "Generate test cases"),
                    ("sync-row", "Index a changed row"),
                    ("sync", "Reconcile indexed models"),
                ],
                max_length=50,
            ),
        ),
        migrations.CreateModel(
            name='IndexedModelStatus',
            fields=[
            ],
            options={
                'verbose_name': 'indexed model',
                'verbose_name_plural': 'indexed models',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('django_rag.job',),
        ),
    ]
