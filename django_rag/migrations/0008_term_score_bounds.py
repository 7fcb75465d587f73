import importlib

from django.db import migrations, models

PREVIOUS = importlib.import_module("django_rag.migrations.0007_statistics_per_collection")

# Per (term, collection), what the best chunk can get from the term in BM25: the largest term
# frequency and the smallest length among the chunks containing it. BM25's tf part grows with
# the frequency and shrinks with the length, so a query's remaining terms are bounded by
# idf * f(max_tf, min_length) (see TermWeights.upper_bound). Inserts append deltas carrying the
# new chunks' figures; compaction folds them with greatest() / least(). Deletes leave the bounds
# as they are: a bound that is too loose is still a bound. Deltas with NULL bounds (deletes,
# the old side of an update) change no bound.
TRIGGER_FUNCTION = """
CREATE OR REPLACE FUNCTION django_rag_fulltext_statistics() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO django_rag_term_delta (collection_id, term, delta, max_tf, min_length)
        SELECT r.collection_id, u.lexeme, count(*),
               max(coalesce(array_length(u.positions, 1), 1)), min(coalesce(r.fts_length, 0))
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
        -- A group whose count does not change is kept when it carries bounds (the new version
        -- may hold a term more often, or be shorter).
        INSERT INTO django_rag_term_delta (collection_id, term, delta, max_tf, min_length)
        SELECT collection_id, term, sum(n), max(tf), min(length) FROM (
            SELECT r.collection_id, u.lexeme AS term, 1 AS n,
                   coalesce(array_length(u.positions, 1), 1) AS tf,
                   coalesce(r.fts_length, 0) AS length
            FROM old_rows o JOIN new_rows r ON r.id = o.id, unnest(r.search_vector) u
            WHERE o.search_vector IS DISTINCT FROM r.search_vector
               OR o.fts_length IS DISTINCT FROM r.fts_length
               OR o.collection_id <> r.collection_id
            UNION ALL
            SELECT o.collection_id, u.lexeme, -1, NULL::integer, NULL::integer
            FROM old_rows o JOIN new_rows r ON r.id = o.id, unnest(o.search_vector) u
            WHERE o.search_vector IS DISTINCT FROM r.search_vector
               OR o.fts_length IS DISTINCT FROM r.fts_length
               OR o.collection_id <> r.collection_id
        ) x GROUP BY collection_id, term HAVING sum(n) <> 0 OR max(tf) IS NOT NULL;
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

# The bounds of the existing base rows, recounted from the chunks. A term whose only rows are
# pending deltas gets a base row with a document frequency of 0 (its deltas hold the count).
BACKFILL = """
INSERT INTO django_rag_term (term, collection_id, document_frequency, max_tf, min_length)
    SELECT u.lexeme, c.collection_id, 0,
           max(coalesce(array_length(u.positions, 1), 1)), min(coalesce(c.fts_length, 0))
    FROM django_rag_chunk c, unnest(c.search_vector) u GROUP BY 1, 2
ON CONFLICT (term, collection_id) DO UPDATE
    SET max_tf = EXCLUDED.max_tf, min_length = EXCLUDED.min_length;
"""


class Migration(migrations.Migration):
    dependencies = [("django_rag", "0007_statistics_per_collection")]

    operations = [
        migrations.AddField(
            model_name="termstatistic",
            name="max_tf",
            field=models.IntegerField(null=True),
        ),
        migrations.AddField(
            model_name="termstatistic",
            name="min_length",
            field=models.IntegerField(null=True),
        ),
        migrations.AddField(
            model_name="termdelta",
            name="max_tf",
            field=models.IntegerField(null=True),
        ),
        migrations.AddField(
            model_name="termdelta",
            name="min_length",
            field=models.IntegerField(null=True),
        ),
        migrations.RunSQL(TRIGGER_FUNCTION + BACKFILL, reverse_sql=PREVIOUS.TRIGGER_FUNCTION),
    ]
