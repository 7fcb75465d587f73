"""Test cases stored without a collection take the collection of their relevant chunks or
documents when those lie in one collection (create_test_case does so from now on), so runs
scoped to it and dashboard users limited to it see them."""

from django.db import migrations

BACKFILL = """
UPDATE django_rag_testcase AS t SET collection_id = s.collection_id
FROM (
    SELECT r.test_case_id,
           MIN(COALESCE(c.collection_id, d.collection_id)) AS collection_id,
           COUNT(DISTINCT COALESCE(c.collection_id, d.collection_id)) AS collections
    FROM django_rag_relevance AS r
    LEFT JOIN django_rag_chunk AS c ON c.id = r.chunk_id
    LEFT JOIN django_rag_document AS d ON d.id = r.document_id
    GROUP BY r.test_case_id
) AS s
WHERE t.id = s.test_case_id AND t.collection_id IS NULL AND s.collections = 1
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_rag", "0013_entity_embedding_model"),
    ]

    operations = [migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop)]
