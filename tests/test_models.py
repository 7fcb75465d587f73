import pytest
from django.db import IntegrityError, connection, transaction

import django_rag as rag
from django_rag.models import Chunk

pytestmark = pytest.mark.django_db


def test_first_migration_creates_pgvector_and_indexes():
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert cursor.fetchone() is not None
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'django_rag_chunk'"
        )
        indexes = dict(cursor.fetchall())
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'django_rag_chunk'::regclass AND attname = 'embedding'"
        )
        assert cursor.fetchone()[0] == "vector(384)"
    assert "hnsw (embedding vector_cosine_ops)" in indexes["django_rag_chunk_hnsw_idx"]
    assert "gin (search_vector)" in indexes["django_rag_chunk_fts_idx"]
    assert any("(collection_id)" in d for d in indexes.values())
    assert any("(document_id, chunk_index)" in d and "UNIQUE" in d for d in indexes.values())


def test_chunk_index_is_unique_per_document():
    doc = rag.ingest("one chunk only", collection="c")
    chunk = doc.chunks.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Chunk.objects.create(
            document=doc,
            collection=doc.collection,
            chunk_index=0,
            text="dup",
            embedding=chunk.embedding,
            embedding_model="m",
        )


def test_offsets_and_pages_must_be_ordered():
    doc = rag.ingest("one chunk only", collection="c")
    chunk = doc.chunks.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        Chunk.objects.filter(pk=chunk.pk).update(start_char=10, end_char=5)
    with pytest.raises(IntegrityError), transaction.atomic():
        Chunk.objects.filter(pk=chunk.pk).update(page_start=3, page_end=2)


def test_deleting_collection_with_documents_is_refused_at_database_level_too():
    from django.db.models import ProtectedError

    from django_rag.models import Collection

    rag.ingest("protected", collection="p")
    with pytest.raises(ProtectedError):
        Collection.objects.filter(name="p").delete()
