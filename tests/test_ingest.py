import threading

import pytest
from django.db import connection

import django_rag as rag
from django_rag.exceptions import (
    CollectionNotEmpty,
    DimensionMismatch,
    DocumentNotFound,
    DocumentTooLarge,
    EmbeddingFailed,
    EmptyDocument,
    InvalidOption,
    InvalidText,
)
from django_rag.models import Chunk, Collection, Document
from django_rag.store import rows as store_rows
from django_rag.testing import HashingEmbedder

from .test_parsers import make_pdf

pytestmark = pytest.mark.django_db

PARAGRAPH = "Refunds are issued to the original payment method within fourteen days. "


def counts():
    return Collection.objects.count(), Document.objects.count(), Chunk.objects.count()


def test_ingest_stores_document_and_chunks():
    text = PARAGRAPH * 40
    doc = rag.ingest(
        text, collection="policies", title="Refunds", metadata={"lang": "en"}, source_id="refunds"
    )
    doc.refresh_from_db()
    assert doc.status == Document.Status.COMPLETED
    assert doc.collection.name == "policies"
    assert doc.metadata == {"lang": "en"}
    chunks = list(doc.chunks.order_by("chunk_index"))
    assert doc.chunk_count == len(chunks) > 1
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert text[chunk.start_char : chunk.end_char] == chunk.text
        assert len(chunk.embedding) == 384
        assert chunk.embedding_model == "hashing-bow"
        assert chunk.collection_id == doc.collection_id
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM django_rag_chunk WHERE document_id = %s AND "
            "search_vector @@ plainto_tsquery('english', 'refund')",
            [doc.pk],
        )
        assert cursor.fetchone()[0] == len(chunks)


def test_failing_embedder_leaves_no_rows(failing_embedder):
    before = counts()
    text = "".join(f"Sentence number {i} is here. " for i in range(400)) + "POISON at the end."
    with pytest.raises(EmbeddingFailed) as info:
        rag.ingest(
            text,
            collection="brand-new",
            embedder=failing_embedder("POISON"),
            chunk_size=50,
            chunk_overlap=0,
        )
    assert info.value.code == "embedding_failed"
    assert info.value.chunk_index > 4  # not the first batch: k is reported exactly
    assert "Nothing was written" in str(info.value)
    assert counts() == before
    assert not Collection.objects.filter(name="brand-new").exists()


def test_failure_while_writing_rolls_back(monkeypatch):
    before = counts()
    # The chunk rows are in (the statement ran) when the write fails.
    original = store_rows.copy_chunks

    def explode(*args, **kwargs):
        original(*args, **kwargs)
        raise RuntimeError("disk full")

    monkeypatch.setattr(store_rows, "copy_chunks", explode)
    with pytest.raises(RuntimeError):
        rag.ingest(PARAGRAPH * 5, collection="rollback")
    assert counts() == before


def test_failed_replace_keeps_the_predecessor(failing_embedder):
    old = rag.ingest(
        "The old handbook says returns take 30 days.", collection="hb", source_id="handbook"
    )
    with pytest.raises(EmbeddingFailed):
        rag.ingest(
            "POISON new handbook",
            collection="hb",
            source_id="handbook",
            replace=True,
            embedder=failing_embedder("POISON"),
        )
    assert list(Document.objects.filter(source_id="handbook")) == [old]
    assert old.chunks.count() == 1


def test_replace_supersedes_previous_version():
    first = rag.ingest("Version one of the travel policy.", collection="hr", source_id="travel")
    second = rag.ingest(
        "Version two of the travel policy.", collection="hr", source_id="travel", replace=True
    )
    assert first.pk != second.pk
    assert list(Document.objects.filter(collection__name="hr")) == [second]
    assert not Chunk.objects.filter(document_id=first.pk).exists()


def test_replace_needs_source_id():
    with pytest.raises(InvalidOption, match="source_id"):
        rag.ingest("text", replace=True)


def test_identical_content_is_not_duplicated():
    first = rag.ingest("Exactly the same words.", collection="dedup", source_id="s")
    again = rag.ingest("Exactly the same words.", collection="dedup", source_id="s")
    assert again.pk == first.pk and again.deduplicated and not first.deduplicated
    other_source = rag.ingest("Exactly the same words.", collection="dedup", source_id="t")
    other_collection = rag.ingest("Exactly the same words.", collection="dedup2", source_id="s")
    assert len({first.pk, other_source.pk, other_collection.pk}) == 3
    replaced = rag.ingest(
        "Exactly the same words.", collection="dedup", source_id="s", replace=True
    )
    assert replaced.pk == first.pk
    assert Document.objects.filter(collection__name="dedup", source_id="s").count() == 1


def test_empty_and_whitespace_text_are_refused():
    before = counts()
    for text in ["", "   \n\t  ", "\x00\x00"]:
        with pytest.raises(EmptyDocument):
            rag.ingest(text, collection="empty")
    assert counts() == before


def test_nul_characters_are_removed():
    doc = rag.ingest("before\x00after and more", collection="nul")
    assert doc.content == "beforeafter and more"
    assert doc.chunks.get().text == "beforeafter and more"


def test_unpaired_surrogates_are_refused():
    broken = b"caf\xe9".decode("utf-8", errors="surrogateescape")
    with pytest.raises(InvalidText, match="surrogate"):
        rag.ingest(broken, collection="bad")


def test_invalid_utf8_bytes_are_refused():
    before = counts()
    with pytest.raises(InvalidText, match="not valid UTF-8"):
        rag.ingest_bytes(b"caf\xe9", filename="latin.txt")
    assert counts() == before


def test_bytes_must_be_bytes_and_need_a_filename():
    with pytest.raises(InvalidOption):
        rag.ingest_bytes("text", filename="a.txt")
    with pytest.raises(InvalidOption):
        rag.ingest_bytes(b"text", filename="")


def test_twenty_megabyte_text_is_refused_by_default_and_accepted_when_allowed(settings):
    big = ("word " * 199 + "end.\n") * 20_972  # about 20 MB
    assert len(big) > 20_000_000
    with pytest.raises(DocumentTooLarge, match="MAX_DOCUMENT_CHARS"):
        rag.ingest(big, collection="big")
    assert not Document.objects.filter(collection__name="big").exists()
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "MAX_DOCUMENT_CHARS": 25_000_000}
    doc = rag.ingest(big, collection="big", chunk_size=250, chunk_overlap=0)
    assert doc.chunk_count == Chunk.objects.filter(document=doc).count() > 10_000
    last = Chunk.objects.filter(document=doc).order_by("-chunk_index").first()
    assert last.end_char == len(big.rstrip())


def test_metadata_must_be_a_json_dict():
    with pytest.raises(InvalidOption):
        rag.ingest("text", metadata=["not", "a", "dict"])
    with pytest.raises(InvalidOption):
        rag.ingest("text", metadata={"when": object()})
    with pytest.raises(InvalidOption):
        rag.ingest("text", metadata={"bad": "nul\x00"})


def test_wrong_dimensions_are_caught_before_writing():
    before = counts()
    with pytest.raises(DimensionMismatch, match="EMBEDDING_DIMENSIONS"):
        rag.ingest("text to embed", embedder=HashingEmbedder(dimensions=8))
    assert counts() == before


def test_ingest_pdf_records_pages_on_chunks():
    pages = [f"Page {n} discusses topic number {n}. " * 30 for n in range(1, 4)]
    doc = rag.ingest_bytes(
        make_pdf(pages), filename="report.pdf", collection="pdfs", chunk_size=60, chunk_overlap=0
    )
    assert doc.original_filename == "report.pdf" and doc.content_type == "application/pdf"
    assert doc.metadata["page_count"] == 3
    chunks = list(doc.chunks.order_by("chunk_index"))
    assert chunks[0].page_start == 1 and chunks[-1].page_end == 3
    assert (
        any(c.page_start < c.page_end for c in chunks) or len({c.page_start for c in chunks}) == 3
    )
    for chunk in chunks:
        # Every page number mentioned in the chunk lies in its page range, and the range is tight.
        mentioned = {int(n) for n in __import__("re").findall(r"topic number (\d)", chunk.text)}
        assert mentioned <= set(range(chunk.page_start, chunk.page_end + 1))
        assert (
            chunk.page_start in mentioned
            or f"number {chunk.page_start}"
            in doc.content[chunk.start_char - 40 : chunk.start_char + 40]
        )


def test_ingest_file_from_disk(tmp_path):
    path = tmp_path / "guide.md"
    path.write_text("# Guide\n\nInstall the package and run migrate.")
    doc = rag.ingest_file(path, collection="guides")
    assert (doc.title, doc.original_filename, doc.content_type) == (
        "Guide",
        "guide.md",
        "text/markdown",
    )


def test_delete_removes_chunks():
    doc = rag.ingest(PARAGRAPH * 20, collection="del")
    assert Chunk.objects.filter(document_id=doc.pk).exists()
    rag.delete(doc)
    assert not Document.objects.filter(pk=doc.pk).exists()
    assert not Chunk.objects.filter(document_id=doc.pk).exists()
    with pytest.raises(DocumentNotFound):
        rag.delete(doc.pk)


def test_non_empty_collection_cannot_be_deleted():
    doc = rag.ingest("keep me", collection="guarded")
    with pytest.raises(CollectionNotEmpty, match="still has 1 document"):
        doc.collection.delete()
    rag.delete(doc)
    Collection.objects.get(name="guarded").delete()
    assert not Collection.objects.filter(name="guarded").exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_replaces_end_with_exactly_one_document():
    from django.db import connections

    errors = []
    barrier = threading.Barrier(6)

    def worker(n):
        try:
            barrier.wait()
            rag.ingest(
                f"Revision {n} of the shared document. " * 30,
                collection="race",
                source_id="shared",
                replace=True,
            )
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    documents = list(Document.objects.filter(collection__name="race", source_id="shared"))
    assert len(documents) == 1
    assert Chunk.objects.filter(collection__name="race").count() == documents[0].chunk_count
    assert Collection.objects.filter(name="race").count() == 1


@pytest.mark.django_db(transaction=True)
def test_old_chunks_stay_searchable_until_the_replacement_commits():
    from django.db import connections

    from django_rag.embeddings import Embedder

    rag.ingest("The office opens at nine in the morning.", collection="live", source_id="hours")
    embedding_started, may_finish = threading.Event(), threading.Event()
    inner = HashingEmbedder()

    class SlowEmbedder(Embedder):
        model_name = inner.model_name

        def _embed(self, texts):
            embedding_started.set()
            assert may_finish.wait(10)
            return inner._embed(texts)

    def replace():
        try:
            rag.ingest(
                "The office now opens at ten.",
                collection="live",
                source_id="hours",
                replace=True,
                embedder=SlowEmbedder(),
            )
        finally:
            connections.close_all()

    thread = threading.Thread(target=replace)
    thread.start()
    assert embedding_started.wait(10)
    during = rag.search("office opens", collection="live")
    may_finish.set()
    thread.join()
    after = rag.search("office opens", collection="live")
    assert [r.text for r in during] == ["The office opens at nine in the morning."]
    assert [r.text for r in after] == ["The office now opens at ten."]


def test_ingest_many_batches_across_documents():
    from django_rag.embeddings import Embedder

    inner = HashingEmbedder()
    calls = []

    class Counting(Embedder):
        model_name = inner.model_name
        batch_size = 32

        def _embed(self, texts):
            calls.append(len(texts))
            return inner._embed(texts)

    items = [
        {"text": f"Document {i} talks about topic {i}.", "source_id": f"s{i}", "metadata": {"n": i}}
        for i in range(40)
    ]
    items.append("A plain string document.")
    docs = rag.ingest_many(items, collection="bulk", embedder=Counting())
    assert len(docs) == 41 and all(d.pk for d in docs)
    assert [d.source_id for d in docs[:3]] == ["s0", "s1", "s2"] and docs[2].metadata == {"n": 2}
    assert calls == [32, 9]  # 41 one-chunk documents embedded in two batches, not 41 calls
    assert Document.objects.filter(collection__name="bulk").count() == 41
    again = rag.ingest_many(items[:2], collection="bulk")
    assert [d.pk for d in again] == [docs[0].pk, docs[1].pk] and again[0].deduplicated
    assert rag.search("topic 7", mode="fulltext", collection="bulk")[0].source_id == "s7"


def test_ingest_many_refuses_bad_items_before_writing_with_on_error_raise():
    before = counts()
    with pytest.raises(EmptyDocument) as info:
        rag.ingest_many(["fine text", "   ", "more text"], collection="bulk-bad", on_error="raise")
    assert "documents[1]" in info.value.__notes__[0]
    with pytest.raises(InvalidOption):
        rag.ingest_many([{"txt": "typo"}], collection="bulk-bad", on_error="raise")
    assert counts() == before


def test_ingest_many_skips_and_reports_a_bad_document_by_default():
    """One empty (or malformed) document no longer fails the whole batch: it is skipped, its
    typed error takes its place in the result, and the others are stored."""
    items = [
        "fine text",
        "   ",
        {"txt": "typo"},
        {"text": "more text", "metadata": {"score": float("nan")}},
        {"text": "last text", "source_id": "last"},
    ]
    results = rag.ingest_many(items, collection="bulk-skip")
    assert isinstance(results[1], EmptyDocument) and "in documents[1]" in results[1].__notes__
    assert isinstance(results[2], InvalidOption) and "in documents[2]" in results[2].__notes__
    assert isinstance(results[3], InvalidOption)
    assert results[1].code == "empty_document"
    assert [d.content for d in (results[0], results[4])] == ["fine text", "last text"]
    stored = Document.objects.filter(collection__name="bulk-skip")
    assert sorted(stored.values_list("content", flat=True)) == ["fine text", "last text"]
    assert all(d.chunk_count == 1 for d in stored)


def test_ingest_many_still_refuses_options_wrong_for_every_document():
    before = counts()
    for options in (
        {"collection": "bad\x00"},
        {"format": "rtf"},
        {"chunk_size": 0},
        {"on_error": "ignore"},
    ):
        with pytest.raises(InvalidOption):
            rag.ingest_many(["one text", "two text"], **{"collection": "opts", **options})
    assert counts() == before


def test_ingest_many_skips_a_document_whose_chunk_the_embedder_refuses(failing_embedder):
    texts = [f"Good document number {i}." for i in range(6)] + ["POISON here"]
    results = rag.ingest_many(
        texts, collection="bulk-skip-embed", embedder=failing_embedder("POISON"), group_size=4
    )
    assert isinstance(results[6], EmbeddingFailed) and "in documents[6]" in results[6].__notes__
    assert all(isinstance(d, Document) for d in results[:6])
    assert Document.objects.filter(collection__name="bulk-skip-embed").count() == 6


def test_ingest_many_embedding_failure_names_the_document(failing_embedder):
    texts = [f"Good document number {i}." for i in range(6)] + ["POISON here"]
    with pytest.raises(EmbeddingFailed, match=r"documents\[6\] chunk 0") as info:
        rag.ingest_many(
            texts,
            collection="bulk-fail",
            embedder=failing_embedder("POISON"),
            group_size=4,
            on_error="raise",
        )
    assert info.value.chunk_index == 0
    # The first group of four was stored; the failing group was not.
    assert Document.objects.filter(collection__name="bulk-fail").count() == 4
