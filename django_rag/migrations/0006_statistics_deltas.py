import importlib

from django.db import migrations, models

PREVIOUS = importlib.import_module("django_rag.migrations.0002_fulltext_statistics")

# The statistics triggers append deltas instead of updating shared rows: concurrent writers
# (replace, delete, ingest in any collection) then never wait for each other on the statistics
# and cannot deadlock there. django_rag.store.compact_statistics folds the deltas in.
TRIGGER_FUNCTION = """
CREATE OR REPLACE FUNCTION django_rag_fulltext_statistics() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO django_rag_term_delta (term, delta)
        SELECT u.lexeme, count(*) FROM new_rows r, unnest(r.search_vector) u GROUP BY u.lexeme;
        INSERT INTO django_rag_corpus_delta (chunk_count, total_length)
        SELECT count(*), coalesce(sum(fts_length), 0) FROM new_rows
        WHERE search_vector IS NOT NULL HAVING count(*) > 0;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO django_rag_term_delta (term, delta)
        SELECT u.lexeme, -count(*) FROM old_rows r, unnest(r.search_vector) u GROUP BY u.lexeme;
        INSERT INTO django_rag_corpus_delta (chunk_count, total_length)
        SELECT -count(*), -coalesce(sum(fts_length), 0) FROM old_rows
        WHERE search_vector IS NOT NULL HAVING count(*) > 0;
    ELSE
        -- Only chunks whose search vector or length changed (re-embedding changes neither).
        INSERT INTO django_rag_term_delta (term, delta)
        SELECT term, sum(n) FROM (
            SELECT u.lexeme AS term, 1 AS n
            FROM old_rows o JOIN new_rows r ON r.id = o.id, unnest(r.search_vector) u
            WHERE o.search_vector IS DISTINCT FROM r.search_vector
            UNION ALL
            SELECT u.lexeme, -1
            FROM old_rows o JOIN new_rows r ON r.id = o.id, unnest(o.search_vector) u
            WHERE o.search_vector IS DISTINCT FROM r.search_vector
        ) x GROUP BY term HAVING sum(n) <> 0;
        INSERT INTO django_rag_corpus_delta (chunk_count, total_length)
        SELECT chunks, length FROM (
            SELECT count(*) FILTER (WHERE r.search_vector IS NOT NULL)
                     - count(*) FILTER (WHERE o.search_vector IS NOT NULL) AS chunks,
                   coalesce(sum(r.fts_length) FILTER (WHERE r.search_vector IS NOT NULL), 0)
                     - coalesce(sum(o.fts_length) FILTER (WHERE o.search_vector IS NOT NULL), 0)
                     AS length
            FROM old_rows o JOIN new_rows r ON r.id = o.id
            WHERE o.search_vector IS DISTINCT FROM r.search_vector
               OR o.fts_length IS DISTINCT FROM r.fts_length
        ) s WHERE chunks <> 0 OR length <> 0;
    END IF;
    RETURN NULL;
END;
$$;
"""

FOLD = """
INSERT INTO django_rag_term (term, document_frequency)
SELECT term, sum(delta) FROM django_rag_term_delta GROUP BY term ORDER BY term
ON CONFLICT (term) DO UPDATE
SET document_frequency = django_rag_term.document_frequency + EXCLUDED.document_frequency;
INSERT INTO django_rag_corpus (id, chunk_count, total_length)
SELECT 1, coalesce(sum(chunk_count), 0), coalesce(sum(total_length), 0) FROM django_rag_corpus_delta
ON CONFLICT (id) DO UPDATE SET
    chunk_count = django_rag_corpus.chunk_count + EXCLUDED.chunk_count,
    total_length = django_rag_corpus.total_length + EXCLUDED.total_length;
"""


class Migration(migrations.Migration):
    dependencies = [("django_rag", "0005_graph")]

    operations = [
        migrations.CreateModel(
            name="TermDelta",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("term", models.TextField(db_index=True)),
                ("delta", models.BigIntegerField()),
            ],
            options={"db_table": "django_rag_term_delta"},
        ),
        migrations.CreateModel(
            name="CorpusDelta",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("chunk_count", models.BigIntegerField()),
                ("total_length", models.BigIntegerField()),
            ],
            options={"db_table": "django_rag_corpus_delta"},
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
                ],
                max_length=50,
            ),
        ),
        # Going back: fold the pending deltas in, then restore the function that updates the
        # base rows directly.
        migrations.RunSQL(TRIGGER_FUNCTION, reverse_sql=[FOLD, PREVIOUS.TRIGGER_FUNCTION]),
    ]
