import importlib

import django.db.models.deletion
from django.db import migrations, models

PREVIOUS = importlib.import_module("django_rag.migrations.0006_statistics_deltas")

# BM25 statistics per collection: a search scoped to collections ranks with theirs, so one
# collection's documents no longer change another's scores. The triggers group the deltas they
# append by the chunk's collection; the base rows are recounted from the chunks.
TRIGGER_FUNCTION = """
CREATE OR REPLACE FUNCTION django_rag_fulltext_statistics() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO django_rag_term_delta (collection_id, term, delta)
        SELECT r.collection_id, u.lexeme, count(*)
        FROM new_rows r, unnest(r.search_vector) u GROUP BY 1, 2;
        INSERT INTO django_rag_corpus_delta (collection_id, chunk_count, total_length)
        SELECT collection_id, count(*), coalesce(sum(fts_length), 0) FROM new_rows
        WHERE search_vector IS NOT NULL GROUP BY collection_id;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO django_rag_term_delta (collection_id, term, delta)
        SELECT r.collection_id, u.lexeme, -count(*)
        FROM old_rows r, unnest(r.search_vector) u GROUP BY 1, 2;
        INSERT INTO django_rag_corpus_delta (collection_id, chunk_count, total_length)
        SELECT collection_id, -count(*), -coalesce(sum(fts_length), 0) FROM old_rows
        WHERE search_vector IS NOT NULL GROUP BY collection_id;
    ELSE
        -- Only chunks whose search vector, length or collection changed (re-embedding changes
        -- none): the new version counts in its collection, the old one is taken off its own.
        INSERT INTO django_rag_term_delta (collection_id, term, delta)
        SELECT collection_id, term, sum(n) FROM (
            SELECT r.collection_id, u.lexeme AS term, 1 AS n
            FROM old_rows o JOIN new_rows r ON r.id = o.id, unnest(r.search_vector) u
            WHERE o.search_vector IS DISTINCT FROM r.search_vector
               OR o.collection_id <> r.collection_id
            UNION ALL
            SELECT o.collection_id, u.lexeme, -1
            FROM old_rows o JOIN new_rows r ON r.id = o.id, unnest(o.search_vector) u
            WHERE o.search_vector IS DISTINCT FROM r.search_vector
               OR o.collection_id <> r.collection_id
        ) x GROUP BY collection_id, term HAVING sum(n) <> 0;
        INSERT INTO django_rag_corpus_delta (collection_id, chunk_count, total_length)
        SELECT collection_id, sum(chunks), sum(length) FROM (
            SELECT r.collection_id, 1 AS chunks, r.fts_length::bigint AS length
            FROM old_rows o JOIN new_rows r ON r.id = o.id
            WHERE r.search_vector IS NOT NULL
              AND (o.search_vector IS DISTINCT FROM r.search_vector
                   OR o.fts_length IS DISTINCT FROM r.fts_length
                   OR o.collection_id <> r.collection_id)
            UNION ALL
            SELECT o.collection_id, -1, -o.fts_length::bigint
            FROM old_rows o JOIN new_rows r ON r.id = o.id
            WHERE o.search_vector IS NOT NULL
              AND (o.search_vector IS DISTINCT FROM r.search_vector
                   OR o.fts_length IS DISTINCT FROM r.fts_length
                   OR o.collection_id <> r.collection_id)
        ) s GROUP BY collection_id HAVING sum(chunks) <> 0 OR sum(length) <> 0;
    END IF;
    RETURN NULL;
END;
$$;
"""

# The per-collection base rows, recounted from the chunks (the deltas were emptied first).
BACKFILL = """
INSERT INTO django_rag_term (term, collection_id, document_frequency)
    SELECT u.lexeme, c.collection_id, count(*)
    FROM django_rag_chunk c, unnest(c.search_vector) u GROUP BY 1, 2;
INSERT INTO django_rag_corpus (collection_id, chunk_count, total_length)
    SELECT collection_id, count(*), coalesce(sum(fts_length), 0) FROM django_rag_chunk
    WHERE search_vector IS NOT NULL GROUP BY collection_id;
"""

CLEAR_DELTAS = "DELETE FROM django_rag_term_delta; DELETE FROM django_rag_corpus_delta;"

# Going back: the database-wide base rows of 0006, recounted from the chunks.
BACKFILL_POOLED = """
INSERT INTO django_rag_term (term, document_frequency)
    SELECT u.lexeme, count(*) FROM django_rag_chunk c, unnest(c.search_vector) u GROUP BY 1;
INSERT INTO django_rag_corpus (id, chunk_count, total_length)
    SELECT 1, count(*), coalesce(sum(fts_length), 0) FROM django_rag_chunk
    WHERE search_vector IS NOT NULL;
"""


def collection(**options):
    return models.ForeignKey(
        db_constraint=False,
        on_delete=django.db.models.deletion.CASCADE,
        related_name="+",
        to="django_rag.collection",
        **options,
    )


class Migration(migrations.Migration):
    dependencies = [("django_rag", "0006_statistics_deltas")]

    # Operations run in this order; going back, each is undone in the reverse order, so the
    # pooled recount (the first operation) runs last, on the restored 0006 tables.
    operations = [
        migrations.RunSQL(migrations.RunSQL.noop, reverse_sql=BACKFILL_POOLED),
        migrations.RunSQL(CLEAR_DELTAS, reverse_sql=CLEAR_DELTAS),
        migrations.DeleteModel(name="TermStatistic"),
        migrations.DeleteModel(name="CorpusStatistic"),
        migrations.CreateModel(
            name="TermStatistic",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "term",
                        "collection",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("term", models.TextField()),
                ("collection", collection()),
                ("document_frequency", models.BigIntegerField(default=0)),
            ],
            options={"db_table": "django_rag_term"},
        ),
        migrations.CreateModel(
            name="CorpusStatistic",
            fields=[
                (
                    "collection",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="django_rag.collection",
                    ),
                ),
                ("chunk_count", models.BigIntegerField(default=0)),
                ("total_length", models.BigIntegerField(default=0)),
            ],
            options={"db_table": "django_rag_corpus"},
        ),
        migrations.AlterField(
            model_name="termdelta",
            name="term",
            field=models.TextField(),
        ),
        # The delta tables are empty here: the default fills no row and is not kept.
        migrations.AddField(
            model_name="termdelta",
            name="collection",
            field=collection(db_index=False, default=0),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="corpusdelta",
            name="collection",
            field=collection(db_index=False, default=0),
            preserve_default=False,
        ),
        migrations.AddIndex(
            model_name="termdelta",
            index=models.Index(fields=["term", "collection"], name="django_rag_term_delta_idx"),
        ),
        migrations.RunSQL(
            TRIGGER_FUNCTION + BACKFILL, reverse_sql=[CLEAR_DELTAS, PREVIOUS.TRIGGER_FUNCTION]
        ),
    ]
