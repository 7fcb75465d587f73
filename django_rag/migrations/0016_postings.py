import importlib

import django.db.models.deletion
from django.db import migrations, models

PREVIOUS = importlib.import_module("django_rag.migrations.0008_term_score_bounds")

# Impact-ordered posting lists (django_rag.models.postings). The chunk triggers now also keep
# django_rag_posting: a new chunk version's (term, impact) pairs go in where the impact is above
# the term's floor in the collection, a deleted or changed chunk's postings go out, and the
# deltas they append count the postings added and removed (``listed``, folded by compaction,
# which trims long lists). The impact is BM25's tf part with the reference parameters of
# django_rag.models.postings, frozen here: k1 1.2, b 0.75, length 100.
IMPACT = "({tf}::float8 * 2.2 / ({tf}::float8 + 1.2 * (0.25 + 0.75 * {length}::float8 / 100.0)))"
_NEW_IMPACT = IMPACT.format(tf="p.tf", length="p.length")
_CHANGED = """(o.search_vector IS DISTINCT FROM r.search_vector
               OR o.fts_length IS DISTINCT FROM r.fts_length
               OR o.collection_id <> r.collection_id)"""

TRIGGER_FUNCTION = f"""
CREATE OR REPLACE FUNCTION django_rag_fulltext_statistics() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        WITH p AS (
            SELECT r.id, r.collection_id, u.lexeme AS term,
                   coalesce(array_length(u.positions, 1), 1) AS tf,
                   coalesce(r.fts_length, 0) AS length
            FROM new_rows r, unnest(r.search_vector) u
        ), added AS (
            INSERT INTO django_rag_posting (chunk_id, term, collection_id, impact, tf, length)
            SELECT p.id, p.term, p.collection_id, {_NEW_IMPACT}, p.tf, p.length FROM p
            LEFT JOIN django_rag_term t ON t.term = p.term AND t.collection_id = p.collection_id
            WHERE {_NEW_IMPACT} > coalesce(t.impact_floor, 0)
            RETURNING collection_id, term
        )
        INSERT INTO django_rag_term_delta (collection_id, term, delta, max_tf, min_length, listed)
        SELECT s.collection_id, s.term, s.n, s.max_tf, s.min_length, coalesce(a.n, 0)
        FROM (SELECT collection_id, term, count(*) AS n, max(tf) AS max_tf,
                     min(length) AS min_length
              FROM p GROUP BY 1, 2) s
        LEFT JOIN (SELECT collection_id, term, count(*) AS n FROM added GROUP BY 1, 2) a
            ON a.collection_id = s.collection_id AND a.term = s.term;
        INSERT INTO django_rag_corpus_delta (collection_id, chunk_count, total_length)
        SELECT collection_id, count(*), coalesce(sum(fts_length), 0) FROM new_rows
        WHERE search_vector IS NOT NULL GROUP BY collection_id;
    ELSIF TG_OP = 'DELETE' THEN
        WITH gone AS (
            DELETE FROM django_rag_posting p USING old_rows o WHERE p.chunk_id = o.id
            RETURNING p.collection_id, p.term
        )
        INSERT INTO django_rag_term_delta (collection_id, term, delta, listed)
        SELECT collection_id, term, 0, -count(*) FROM gone GROUP BY 1, 2;
        INSERT INTO django_rag_term_delta (collection_id, term, delta)
        SELECT r.collection_id, u.lexeme, -count(*)
        FROM old_rows r, unnest(r.search_vector) u GROUP BY 1, 2;
        INSERT INTO django_rag_corpus_delta (collection_id, chunk_count, total_length)
        SELECT collection_id, -count(*), -coalesce(sum(fts_length), 0) FROM old_rows
        WHERE search_vector IS NOT NULL GROUP BY collection_id;
    ELSE
        -- Only chunks whose search vector, length or collection changed (re-embedding changes
        -- none). Their postings go first (a statement of its own: the new ones may have the
        -- same keys), then the new version's go in and the statistics move as before.
        WITH gone AS (
            DELETE FROM django_rag_posting p
            USING old_rows o JOIN new_rows r ON r.id = o.id
            WHERE p.chunk_id = o.id AND {_CHANGED}
            RETURNING p.collection_id, p.term
        )
        INSERT INTO django_rag_term_delta (collection_id, term, delta, listed)
        SELECT collection_id, term, 0, -count(*) FROM gone GROUP BY 1, 2;
        WITH p AS (
            SELECT r.id, r.collection_id, u.lexeme AS term,
                   coalesce(array_length(u.positions, 1), 1) AS tf,
                   coalesce(r.fts_length, 0) AS length
            FROM old_rows o JOIN new_rows r ON r.id = o.id, unnest(r.search_vector) u
            WHERE {_CHANGED}
        ), added AS (
            INSERT INTO django_rag_posting (chunk_id, term, collection_id, impact, tf, length)
            SELECT p.id, p.term, p.collection_id, {_NEW_IMPACT}, p.tf, p.length FROM p
            LEFT JOIN django_rag_term t ON t.term = p.term AND t.collection_id = p.collection_id
            WHERE {_NEW_IMPACT} > coalesce(t.impact_floor, 0)
            RETURNING collection_id, term
        )
        -- A group whose count does not change is kept when it carries bounds (the new version
        -- may hold a term more often, or be shorter) or postings.
        INSERT INTO django_rag_term_delta (collection_id, term, delta, max_tf, min_length, listed)
        SELECT collection_id, term, sum(n), max(tf), min(length), sum(listed) FROM (
            SELECT collection_id, term, 1 AS n, tf, length, 0 AS listed FROM p
            UNION ALL
            SELECT o.collection_id, u.lexeme, -1, NULL::integer, NULL::integer, 0
            FROM old_rows o JOIN new_rows r ON r.id = o.id, unnest(o.search_vector) u
            WHERE {_CHANGED}
            UNION ALL
            SELECT collection_id, term, 0, NULL::integer, NULL::integer, 1 FROM added
        ) x GROUP BY collection_id, term
        HAVING sum(n) <> 0 OR max(tf) IS NOT NULL OR sum(listed) <> 0;
        INSERT INTO django_rag_corpus_delta (collection_id, chunk_count, total_length)
        SELECT collection_id, sum(chunks), sum(length) FROM (
            SELECT r.collection_id, 1 AS chunks, r.fts_length::bigint AS length
            FROM old_rows o JOIN new_rows r ON r.id = o.id
            WHERE r.search_vector IS NOT NULL AND {_CHANGED}
            UNION ALL
            SELECT o.collection_id, -1, -o.fts_length::bigint
            FROM old_rows o JOIN new_rows r ON r.id = o.id
            WHERE o.search_vector IS NOT NULL AND {_CHANGED}
        ) s GROUP BY collection_id HAVING sum(chunks) <> 0 OR sum(length) <> 0;
    END IF;
    RETURN NULL;
END;
$$;
"""


def build_lists(apps, schema_editor):
    from django_rag.store.postings import rebuild_postings

    rebuild_postings(schema_editor.connection.alias)


class Migration(migrations.Migration):
    dependencies = [("django_rag", "0015_conversations")]

    operations = [
        migrations.AddField(
            model_name="termdelta",
            name="listed",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="termstatistic",
            name="impact_floor",
            field=models.FloatField(db_default=0.0, default=0.0),
        ),
        migrations.AddField(
            model_name="termstatistic",
            name="listed",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.CreateModel(
            name="Posting",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "chunk_id",
                        "term",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("chunk_id", models.BigIntegerField()),
                ("term", models.TextField()),
                ("impact", models.FloatField()),
                ("tf", models.SmallIntegerField()),
                ("length", models.IntegerField()),
                (
                    "collection",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="django_rag.collection",
                    ),
                ),
            ],
            options={
                "db_table": "django_rag_posting",
                "indexes": [
                    models.Index(
                        fields=["term", "collection", "-impact"],
                        name="django_rag_posting_impact_idx",
                    )
                ],
            },
        ),
        migrations.RunSQL(TRIGGER_FUNCTION, reverse_sql=PREVIOUS.TRIGGER_FUNCTION),
        migrations.RunPython(build_lists, migrations.RunPython.noop, elidable=False),
    ]
