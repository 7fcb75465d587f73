"""A configured memory store receives every write and answers searches on its own."""

import pytest

import django_rag as rag
from django_rag import maintenance
from django_rag.models import Chunk
from django_rag.retrieval import MemoryVectorStore, get_vector_store

pytestmark = pytest.mark.django_db


@pytest.fixture
def memory(settings):
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "VECTOR_STORE": "memory"}
    store = get_vector_store()
    assert isinstance(store, MemoryVectorStore) and len(store) == 0
    return store


def test_ingest_replace_delete_and_reembed_reach_the_memory_store(memory, settings):
    first = rag.ingest("Refunds take fourteen days.", collection="m", source_id="refunds")
    rag.ingest("Parcels ship from the harbour.", collection="m", source_id="parcels")
    assert len(memory) == Chunk.objects.count() == 2
    hits = rag.search("refunds", collection="m", mode="fulltext")
    assert [h.chunk_id for h in hits] == list(first.chunks.values_list("pk", flat=True))
    assert hits[0].source_id == "refunds" and hits[0].document_id == first.pk

    newer = rag.ingest(
        "Refunds now take ten days.", collection="m", source_id="refunds", replace=True
    )
    assert len(memory) == 2
    assert [h.document_id for h in rag.search("refunds", collection="m")][:1] == [newer.pk]

    rag.delete(newer)
    assert len(memory) == 1
    assert all(h.source_id == "parcels" for h in rag.search("refunds", collection="m"))

    # Re-embedding with another model hands the new vectors over (to a fresh store here: new
    # settings build a new one, which only knows what is written from then on).
    settings.DJANGO_RAG = {
        "EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"model_name": "hashing-v2"}},
        "VECTOR_STORE": "memory",
    }
    store = get_vector_store()
    rag.ingest("Vouchers expire after a year.", collection="m", source_id="vouchers")
    assert len(store) == 1
    job = maintenance.reembed()  # the "parcels" chunk still has the old model's vector
    assert job.done == 1 and len(store) == 2
    assert {h.source_id for h in rag.search("vouchers expire", collection="m")} >= {"vouchers"}


def test_a_failing_store_rolls_the_write_back(settings):
    class Broken(MemoryVectorStore):
        def store(self, chunks, vectors):
            raise RuntimeError("index unavailable")

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "VECTOR_STORE": Broken()}
    with pytest.raises(RuntimeError):
        rag.ingest("Nothing should stay.", collection="m")
    assert not Chunk.objects.exists()
