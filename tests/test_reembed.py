"""Re-embedding: in place by model, --all, and the zero-downtime switch to NEXT_EMBEDDER."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

import django_rag as rag
from django_rag import maintenance
from django_rag.embeddings import get_embedder
from django_rag.exceptions import InvalidInput, UnknownCollection
from django_rag.models import Chunk, Job
from django_rag.testing import HashingEmbedder

pytestmark = pytest.mark.django_db

TEXTS = [f"Document {i} talks about topic{i} and shared words like apples." for i in range(12)]
NEXT = {"BACKEND": "hashing", "OPTIONS": {"dimensions": 256, "model_name": "hashing-256"}}


def column_type(name="embedding"):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
            "'django_rag_chunk'::regclass AND attname = %s AND NOT attisdropped",
            [name],
        )
        row = cursor.fetchone()
    return row[0] if row else None


@pytest.fixture
def corpus():
    for i, text in enumerate(TEXTS):
        rag.ingest(text, collection="a" if i % 2 else "b", source_id=str(i))


def test_in_place_reembeds_only_chunks_of_another_model(corpus):
    old = HashingEmbedder(model_name="old-model")
    for i in range(3):
        rag.ingest(f"legacy text {i} about pears", collection="a", embedder=old)
    seen = []
    job = maintenance.reembed(batch_size=2, progress=lambda done, total: seen.append((done, total)))
    assert job.status == "completed" and job.done == 3 and job.result["model"] == "hashing-bow"
    assert seen[-1] == (3, 3) and len(seen) == 2
    assert not Chunk.objects.exclude(embedding_model="hashing-bow").exists()
    assert maintenance.reembed().done == 0  # nothing left to do
    hit = rag.search("legacy text 1 pears", collection="a", limit=1)[0]
    assert hit.text == "legacy text 1 about pears"


def test_in_place_scoped_to_a_collection(corpus):
    old = HashingEmbedder(model_name="old-model")
    rag.ingest("in a", collection="a", embedder=old)
    rag.ingest("in b", collection="b", embedder=old)
    assert maintenance.reembed(collection="a").done == 1
    assert Chunk.objects.get(text="in b").embedding_model == "old-model"
    with pytest.raises(UnknownCollection):
        maintenance.reembed(collection="zzz")
    with pytest.raises(InvalidInput):
        maintenance.reembed(batch_size=0)


def test_switch_to_a_model_with_other_dimensions_keeps_search_answering(corpus):
    assert column_type() == "vector(384)"
    answers = []

    def search_meanwhile(done, total):
        # Every batch: search still uses the current model and column, and finds the text.
        assert get_embedder().model_name == "hashing-bow"
        # Scoped to one collection: an exact scan, so the assertion does not depend on the
        # approximate HNSW graph of a 12-chunk table being updated in this same transaction.
        hits = rag.search("topic7 apples", collection="a", limit=1)
        answers.append(hits[0].source_id)

    from django_rag.models import Collection, Entity

    entity = Entity.objects.create(
        collection=Collection.objects.get(name="a"),
        name="Topic7",
        normalized_name="topic7",
        embedding=HashingEmbedder().embed_documents(["Topic7"])[0],
    )
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "NEXT_EMBEDDER": NEXT}):
        assert get_embedder().model_name == "hashing-bow"
        job = maintenance.reembed(batch_size=5, progress=search_meanwhile)
        # Graph entities follow the switch: re-embedded with the new model and size.
        entity.refresh_from_db()
        assert len(entity.embedding) == 256
        assert job.kind == "embedding-switch" and job.status == "completed"
        assert job.done == job.total == len(TEXTS)
        assert answers == ["7"] * len(answers) and len(answers) == 3
        # Swapped: the column is the new size, every chunk is on the new model, and every
        # process now embeds queries and new chunks with NEXT_EMBEDDER.
        assert column_type() == "vector(256)" and column_type("embedding_next") is None
        assert set(Chunk.objects.values_list("embedding_model", flat=True)) == {"hashing-256"}
        assert get_embedder().model_name == "hashing-256"
        assert rag.search("topic7 apples", collection="a", limit=1)[0].source_id == "7"
        doc = rag.ingest("A new document about topic99.", collection="a")
        assert doc.chunks.get().embedding_model == "hashing-256"
        assert rag.search("topic99", limit=1)[0].document_id == doc.pk
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'django_rag_chunk'")
        indexes = {row[0] for row in cursor.fetchall()}
    assert {"django_rag_chunk_hnsw_idx", "django_rag_chunk_model_idx"} <= indexes
    assert "django_rag_chunk_hnsw_next" not in indexes


class FailsOnce(HashingEmbedder):
    calls = 0

    def _embed(self, texts):
        type(self).calls += 1
        if type(self).calls == 3:
            raise RuntimeError("killed mid-run")
        return super()._embed(texts)


def test_an_interrupted_switch_resumes_and_writes_each_chunk_once(corpus):
    failing = FailsOnce(dimensions=256, model_name="hashing-256")
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "NEXT_EMBEDDER": failing}):
        with pytest.raises(RuntimeError, match="killed mid-run"):
            maintenance.reembed(batch_size=4)
        job = Job.objects.get(kind="embedding-switch")
        assert job.status == "failed" and "killed mid-run" in job.error
        assert job.done == 8 and column_type("embedding_next") == "vector(256)"
        # Searches were never affected: the current column is untouched.
        assert get_embedder().model_name == "hashing-bow"
        assert rag.search("topic3 apples", collection="a", limit=1)[0].source_id == "3"
        rag.ingest("Ingested while the switch was paused: topic42.", collection="b")
        resumed = maintenance.reembed(batch_size=4, resume=True)
        assert resumed.pk == job.pk and resumed.status == "completed"
        # done counts written rows: 13 chunks, 13 writes, so no chunk was written twice.
        assert resumed.done == 13 == Chunk.objects.count()
        assert get_embedder().model_name == "hashing-256"
        assert rag.search("topic42", limit=1)[0].text.endswith("topic42.")


def test_all_reembeds_every_chunk_with_the_current_model(corpus):
    job = maintenance.reembed(all=True, batch_size=5)
    assert job.kind == "embedding-switch" and job.done == len(TEXTS)
    assert column_type() == "vector(384)"
    assert rag.search("topic5 apples", collection="a", limit=1)[0].source_id == "5"
    with pytest.raises(InvalidInput, match="--collection"):
        maintenance.reembed(all=True, collection="a")


def test_rag_reembed_command(corpus):
    old = HashingEmbedder(model_name="old-model")
    rag.ingest("legacy", collection="a", embedder=old)
    out = StringIO()
    call_command("rag_reembed", "--batch-size", "10", "--quiet", stdout=out, stderr=StringIO())
    assert out.getvalue() == ""
    rag.ingest("legacy two", collection="a", embedder=old)
    call_command("rag_reembed", "--concurrency", "2", stdout=out, stderr=StringIO())
    assert "Re-embedded 1 chunk with hashing-bow" in out.getvalue()


def test_orphans_dry_run_and_apply(corpus):
    out = StringIO()
    call_command("rag_maintenance", "orphans", stdout=out)
    assert "Found 0 chunks without document" in out.getvalue()
    chunk = Chunk.objects.filter(collection__name="a").first()
    other = Chunk.objects.filter(collection__name="b").first()
    Chunk.objects.filter(pk=chunk.pk).update(collection=other.collection)  # inconsistent
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # this test's writes are pending
        cursor.execute(
            "ALTER TABLE django_rag_chunk ADD COLUMN embedding_next vector(8), "
            "ADD COLUMN embedding_model_next varchar(255)"
        )
    assert maintenance.find_orphans() == {
        "chunks_without_document": 0,
        "chunks_in_wrong_collection": 1,
        "stale_shadow_column": 1,
    }
    out = StringIO()
    call_command("rag_maintenance", "orphans", stdout=out)
    assert "Dry run" in out.getvalue() and Chunk.objects.filter(pk=chunk.pk).exists()
    call_command("rag_maintenance", "orphans", "--apply", stdout=StringIO())
    assert not Chunk.objects.filter(pk=chunk.pk).exists()
    assert column_type("embedding_next") is None
    assert maintenance.find_orphans() == {
        "chunks_without_document": 0,
        "chunks_in_wrong_collection": 0,
        "stale_shadow_column": 0,
    }


def test_rag_info_redacts_secrets(corpus):
    import json

    settings = {"EMBEDDER": "hashing", "LLM": {"model": "openai/gpt-4o-mini", "api_key": "sk-top"}}
    with override_settings(DJANGO_RAG=settings):
        out = StringIO()
        call_command("rag_info", stdout=out)
        text = out.getvalue()
        data = json.loads(_call_json())
    assert "sk-top" not in text and "[REDACTED]" in text
    assert "Embedder: hashing-bow (384 dimensions)" in text and "a: 6 documents, 6 chunks" in text
    assert data["settings"]["LLM"]["api_key"] == "[REDACTED]" and data["pgvector"]
    assert data["chunks_by_model"] == {"hashing-bow": 12}


def _call_json():
    out = StringIO()
    call_command("rag_info", "--json", stdout=out)
    return out.getvalue()
