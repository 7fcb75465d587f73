"""The batched write path (``ingest_many``, ``ingest_files``, ``store.write_documents``) against
real PostgreSQL: duplicates inside a batch and against stored documents, replace, atomicity of
a group, the statistics, and concurrent overlapping batches from real threads."""

import random
import threading

import pytest
from django.db import connection, connections

import django_rag as rag
from django_rag.exceptions import InvalidOption, UnsupportedFileType
from django_rag.ingestion.service import ingest_files
from django_rag.models import Chunk, CorpusDelta, Document, TermDelta
from django_rag.store import recount_statistics
from django_rag.store import rows as store_rows
from django_rag.testing import HashingEmbedder
from tests.helpers import assert_statistics_exact

WORDS = "refund parcel harbour station ledger invoice courier warranty voucher tariff".split()


def text(seed: int, sentences: int = 3) -> str:
    rng = random.Random(seed)
    return "\n\n".join(
        " ".join(rng.choice(WORDS) for _ in range(10)) + f" item{seed}." for _ in range(sentences)
    )


def chunk_rows(collection: str):
    return list(
        Chunk.objects.filter(collection__name=collection)
        .order_by("document_id", "chunk_index")
        .values_list("document_id", "chunk_index", "text", "search_vector", "fts_length")
    )


@pytest.mark.django_db
def test_duplicates_inside_the_batch_and_against_stored_documents():
    stored = rag.ingest(text(1), collection="b", source_id="a")
    results = rag.ingest_many(
        [
            {"text": text(1), "source_id": "a"},  # stored already
            {"text": text(2), "source_id": "b"},
            {"text": text(2), "source_id": "b"},  # the one just above
            text(3),
            text(3),  # no source: identity by content
            {"text": text(4), "source_id": "a"},  # same source, new content, no replace: kept
        ],
        collection="b",
    )
    assert results[0].pk == stored.pk and results[0].deduplicated
    assert not results[1].deduplicated and results[2].pk == results[1].pk
    assert results[2].deduplicated
    assert (
        not results[3].deduplicated and results[4].pk == results[3].pk and results[4].deduplicated
    )
    assert not results[5].deduplicated and results[5].pk != stored.pk
    assert Document.objects.filter(collection__name="b").count() == 4
    for document in Document.objects.filter(collection__name="b"):
        assert document.status == Document.Status.COMPLETED
        assert document.chunks.count() == document.chunk_count > 0
    # The vectors arrive intact (sent in pgvector's binary format).
    chunk = Chunk.objects.filter(document=results[1]).order_by("chunk_index").first()
    expected = HashingEmbedder().embed_documents([chunk.text])[0]
    assert list(chunk.embedding) == pytest.approx(expected, abs=1e-7)
    # Full-text vectors and lengths were computed in the insert, as index_chunks would.
    rows = chunk_rows("b")
    with connection.cursor() as cursor:
        for _, _, chunk_text, vector, length in rows:
            cursor.execute("SELECT to_tsvector('english', %s)::text", [chunk_text])
            assert vector == cursor.fetchone()[0]
            assert length > 0
    assert_statistics_exact()


@pytest.mark.django_db
def test_replace_in_a_batch_keeps_the_last_version_of_each_source():
    rag.ingest(text(10), collection="r", source_id="x")
    results = rag.ingest_many(
        [
            {"text": text(11), "source_id": "x"},
            {"text": text(12), "source_id": "y"},
            {"text": text(13), "source_id": "x"},
        ],
        collection="r",
        replace=True,
    )
    remaining = {d.source_id: d for d in Document.objects.filter(collection__name="r")}
    assert set(remaining) == {"x", "y"}
    assert remaining["x"].pk == results[2].pk and remaining["x"].content == text(13)
    assert remaining["y"].pk == results[1].pk
    assert Chunk.objects.filter(collection__name="r").count() == sum(
        d.chunk_count for d in remaining.values()
    )
    # The same again: all duplicates, nothing rewritten.
    again = rag.ingest_many([{"text": text(13), "source_id": "x"}], collection="r", replace=True)
    assert again[0].deduplicated and again[0].pk == results[2].pk
    assert_statistics_exact()


@pytest.mark.django_db(transaction=True)
def test_a_group_whose_write_fails_leaves_nothing(monkeypatch):
    rag.ingest(text(20), collection="f", source_id="old")
    before = (Document.objects.count(), Chunk.objects.count(), recount_statistics()["stored"])
    original = store_rows.copy_chunks
    calls = []

    def explode(*args, **kwargs):
        calls.append(1)
        ids = original(*args, **kwargs)  # the rows are in when the write fails
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return ids

    monkeypatch.setattr(store_rows, "copy_chunks", explode)
    items = [{"text": text(21 + i), "source_id": f"s{i}"} for i in range(4)]
    items.append({"text": text(30), "source_id": "old"})  # a replace inside the failing group
    with pytest.raises(RuntimeError, match="disk full"):
        rag.ingest_many(items, collection="f", group_size=2, replace=True)
    # The first group (s0, s1) was committed; the second (s2, s3) left nothing.
    stored = set(Document.objects.filter(collection__name="f").values_list("source_id", flat=True))
    assert stored == {"old", "s0", "s1"}
    assert before[0] + 2 == Document.objects.count()
    assert_statistics_exact()
    # The committed group's statistics deltas were folded despite the failure.
    assert not TermDelta.objects.exists() and not CorpusDelta.objects.exists()
    monkeypatch.setattr(store_rows, "copy_chunks", original)
    # Nothing half-written blocks the retry.
    rag.ingest_many(items, collection="f", group_size=2, replace=True)
    stored = {d.source_id: d for d in Document.objects.filter(collection__name="f")}
    assert set(stored) == {"old", "s0", "s1", "s2", "s3"}
    assert stored["old"].content == text(30)
    assert_statistics_exact()
    assert not TermDelta.objects.exists() and not CorpusDelta.objects.exists()


@pytest.mark.django_db
def test_the_next_group_is_embedded_while_the_previous_one_is_written(monkeypatch):
    """Pipelining: embedding runs on another thread, writes on the caller's."""
    threads = {"embed": set(), "write": set()}
    original = store_rows.copy_chunks

    def writing(*args, **kwargs):
        threads["write"].add(threading.get_ident())
        return original(*args, **kwargs)

    monkeypatch.setattr(store_rows, "copy_chunks", writing)

    class Recording(HashingEmbedder):
        def embed_documents(self, texts):
            threads["embed"].add(threading.get_ident())
            return super().embed_documents(texts)

    results = rag.ingest_many(
        [text(40 + i) for i in range(6)], collection="p", group_size=2, embedder=Recording()
    )
    assert len({d.pk for d in results}) == 6
    assert threads["write"] == {threading.get_ident()}
    assert threads["embed"] and threading.get_ident() not in threads["embed"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_concurrent_overlapping_batches_end_with_one_document_per_identity():
    identities = [f"id{i}" for i in range(12)]
    errors = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(4):
                chosen = rng.sample(identities, 8)
                rag.ingest_many(
                    [
                        {"text": text(100 + rng.randrange(3) * 100 + int(i[2:])), "source_id": i}
                        for i in chosen
                    ],
                    collection="race",
                    replace=True,
                    group_size=rng.choice([3, 8]),
                )
                # Plain duplicates too (no replace), racing the replaces.
                rag.ingest_many(
                    [{"text": text(500 + int(i[2:]))} for i in chosen[:3]], collection="race"
                )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    documents_ = list(Document.objects.filter(collection__name="race"))
    by_source: dict = {}
    for document in documents_:
        by_source.setdefault(document.source_id or document.content_hash, []).append(document)
    assert all(len(found) == 1 for found in by_source.values()), by_source
    assert set(identities) <= set(by_source)
    for document in documents_:
        assert document.chunks.count() == document.chunk_count
    assert_statistics_exact()


@pytest.mark.django_db
def test_ingest_files_collects_failures_and_reports_progress(tmp_path):
    (tmp_path / "a.txt").write_text(text(60))
    (tmp_path / "b.md").write_text("# Title\n\n" + text(61))
    (tmp_path / "empty.txt").write_text("   ")
    (tmp_path / "c.xyz").write_text("unsupported")
    seen = []
    paths = sorted(tmp_path.iterdir())
    results = ingest_files(
        paths,
        collection="files",
        metadata={"team": "support"},
        group_size=1,
        progress=lambda done, total: seen.append((done, total)),
    )
    by_name = {path.name: result for path, result in zip(paths, results, strict=True)}
    assert isinstance(by_name["c.xyz"], UnsupportedFileType)
    assert "empty" in str(by_name["empty.txt"]).lower()
    stored = by_name["a.txt"], by_name["b.md"]
    assert all(isinstance(d, Document) and not d.deduplicated for d in stored)
    assert {d.metadata["team"] for d in stored} == {"support"}
    assert by_name["b.md"].original_filename == "b.md" and by_name["a.txt"].source_id == str(
        tmp_path / "a.txt"
    )
    total = sum(d.chunk_count for d in stored)
    assert seen and seen[-1] == (total, total)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    again = ingest_files(paths[:2], collection="files", metadata={"team": "support"})
    assert all(d.deduplicated for d in again)
    with pytest.raises(InvalidOption):
        ingest_files(paths, collection="files", chunk_size=10, chunk_overlap=10)
    assert_statistics_exact()


def test_embed_texts_batches_by_length_and_keeps_the_input_order():
    from django_rag.exceptions import EmbeddingFailed
    from django_rag.ingestion.prepare import embed_texts

    batches = []

    class Recording(HashingEmbedder):
        def __init__(self):
            super().__init__()
            self.batch_size = 2

        def embed_documents(self, texts):
            batches.append(list(texts))
            if any("POISON" in t for t in texts):
                raise RuntimeError("refused")
            return super().embed_documents(texts)

    texts = ["a", "ccc ccc ccc", "bb bb", "dddd dddd dddd dddd", "e e"]
    vectors = embed_texts(Recording(), texts)
    reference = HashingEmbedder().embed_documents(texts)
    assert vectors == reference  # each vector in its text's place
    assert [len(b[0]) >= len(b[-1]) for b in batches] == [True] * len(batches)
    assert batches[0] == ["dddd dddd dddd dddd", "ccc ccc ccc"]
    with pytest.raises(EmbeddingFailed) as info:
        embed_texts(Recording(), ["short", "a much longer POISON text here", "mid text"])
    assert info.value.chunk_index == 1 and "chunk 1" in str(info.value)


@pytest.mark.django_db
def test_ingest_many_hands_chunks_to_a_receiving_store_and_stores_the_graph(settings):
    from django_rag.models import Entity
    from django_rag.retrieval import MemoryVectorStore, get_vector_store

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "VECTOR_STORE": "memory"}
    store = get_vector_store()
    assert isinstance(store, MemoryVectorStore)
    results = rag.ingest_many(
        [
            {"text": "Jane Doe met Acme Corp in Berlin.", "source_id": "one"},
            {"text": "Acme Corp builds drills in Lyon.", "source_id": "two"},
        ],
        collection="m",
        graph=True,
    )
    chunk_ids = set(Chunk.objects.filter(collection__name="m").values_list("pk", flat=True))
    assert len(store) == len(chunk_ids) == sum(d.chunk_count for d in results)
    hits = rag.search("drills in Lyon", collection="m")
    assert hits and hits[0].source_id == "two" and hits[0].chunk_id in chunk_ids
    names = set(Entity.objects.values_list("normalized_name", flat=True))
    assert {"acme corp", "berlin", "lyon"} <= names


@pytest.mark.django_db
def test_a_failing_receiving_store_rolls_the_group_back(settings):
    from django_rag.retrieval import MemoryVectorStore

    class Broken(MemoryVectorStore):
        def store(self, chunks, vectors):
            raise RuntimeError("index unavailable")

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "VECTOR_STORE": Broken()}
    with pytest.raises(RuntimeError):
        rag.ingest_many([text(70), text(71)], collection="m")
    assert not Chunk.objects.exists() and not Document.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_ingest_files_keeps_the_other_files_when_one_fails_to_store(tmp_path, monkeypatch):
    from django.db import DataError

    paths = []
    for i in range(4):
        path = tmp_path / f"f{i}.txt"
        path.write_text(text(80 + i) + f" marker{i}")
        paths.append(path)
    original = store_rows.copy_chunks

    def refuse_f2(rows, **kwargs):
        if any("marker2" in row.text for _, row in rows):
            raise DataError("value too long for this column")
        return original(rows, **kwargs)

    monkeypatch.setattr(store_rows, "copy_chunks", refuse_f2)
    results = ingest_files(paths, collection="store-failure", group_size=2)
    # f2's group (f2, f3) failed as a whole, then each was written alone: only f2 is lost.
    assert isinstance(results[2], DataError) and "too long" in str(results[2])
    assert all(isinstance(results[i], Document) for i in (0, 1, 3))
    stored = Document.objects.filter(collection__name="store-failure")
    assert sorted(d.original_filename for d in stored) == ["f0.txt", "f1.txt", "f3.txt"]
    assert all(d.chunk_count == d.chunks.count() > 0 for d in stored)
    assert_statistics_exact()


@pytest.mark.django_db
def test_chunk_rows_are_inserted_in_slices_and_errors_are_djangos(monkeypatch):
    from django.db import DatabaseError

    monkeypatch.setattr(store_rows, "COPY_ROWS", 3)  # 3 rows per INSERT
    statements = []
    original = store_rows._copy_chunks
    monkeypatch.setattr(
        store_rows,
        "_copy_chunks",
        lambda rows, **kw: statements.append(len(rows)) or original(rows, **kw),
    )
    long_text = "\n\n".join(f"Paragraph {i}. " + " ".join(WORDS * 3) for i in range(12))
    document = rag.ingest(long_text, collection="sliced", chunk_size=40, chunk_overlap=0)
    assert document.chunk_count > 3 and sum(statements) == document.chunk_count
    assert max(statements) == 3
    rows = list(document.chunks.order_by("chunk_index").values_list("chunk_index", "text"))
    assert [index for index, _ in rows] == list(range(document.chunk_count))
    assert rows[0][1].startswith("Paragraph 0.")
    assert_statistics_exact()
    # A value PostgreSQL refuses comes back as Django's DatabaseError (what retries and callers
    # catch), not as a raw driver exception.
    row = store_rows.ChunkRow(chunk_index=0, text="hello", embedding=[0.1] * 384)
    with pytest.raises(DatabaseError):
        with connection.cursor():
            store_rows.copy_chunks(
                [(document.pk, row)], collection_id=document.collection_id, model_name="m" * 300
            )
