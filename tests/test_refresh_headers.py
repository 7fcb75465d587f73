"""rag_maintenance headers: stored chunks get (or lose) the header CHUNK_HEADERS gives new ones,
re-indexed and re-embedded, one document at a time under its row lock."""

import threading
import time
from io import StringIO
from unittest import mock

import numpy as np
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings

import django_rag as rag
from django_rag import maintenance
from django_rag.exceptions import InvalidInput, UnknownCollection
from django_rag.ingestion.parsers import parser_formats
from django_rag.models import Chunk, Document
from django_rag.store.headers import with_header
from django_rag.testing import HashingEmbedder
from tests.test_chunk_headers import GUIDE, OFF, ON, PG_TEXTSEARCH

NOTES = "Plain notes.\n\n# not a heading in plain text\n\nMore notes about the garden shed."
PAGE = (
    "<h1>Shed</h1><p>The shed holds the spades, the rakes, the hoses and the seed trays "
    "through the winter months.</p><h2>Locks</h2><p>Lock it every night, and check the "
    "padlock on the back door before you leave the garden.</p>"
)


def ingest_all(collection: str) -> list[Document]:
    options = {"collection": collection, "chunk_size": 20, "chunk_overlap": 0}
    return [
        rag.ingest(GUIDE, format="markdown", title="Kitchen garden handbook", **options),
        rag.ingest(NOTES, title="Notes", **options),
        rag.ingest(PAGE, format="html", title="Shed page", **options),
    ]


def chunks_of(document) -> list[Chunk]:
    return list(Chunk.objects.filter(document=document).order_by("chunk_index"))


def fulltext_count(document, word: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM django_rag_chunk WHERE document_id = %s "
            "AND search_vector @@ to_tsquery('english', %s)",
            [document.pk, word],
        )
        return cursor.fetchone()[0]


def assert_embedded_as_ingest_would(document):
    embedder = HashingEmbedder()
    for chunk in chunks_of(document):
        expected = embedder.embed_documents([with_header(chunk.text, chunk.metadata.get("header"))])
        assert np.allclose(chunk.embedding, expected[0], atol=1e-6)


@pytest.mark.django_db
def test_refresh_gives_stored_chunks_the_headers_of_ingest_and_takes_them_away():
    with override_settings(DJANGO_RAG=OFF):
        stored = ingest_all("garden")
        untouched = rag.ingest(GUIDE, format="markdown", title="Other", collection="other")
    Chunk.objects.filter(document=stored[1]).update(metadata={"kept": "yes"})
    total = sum(len(chunks_of(d)) for d in stored)
    with override_settings(DJANGO_RAG=ON):
        reference = ingest_all("reference")  # what ingest gives with the setting on
        dry = maintenance.refresh_headers(collection="garden")
        assert dry == {"documents": 3, "chunks": total}
        assert all("header" not in c.metadata for d in stored for c in chunks_of(d))  # dry

        assert maintenance.refresh_headers(collection="garden", apply=True) == dry
        for document, fresh in zip(stored, reference, strict=True):
            assert [c.metadata.get("header") for c in chunks_of(document)] == [
                c.metadata.get("header") for c in chunks_of(fresh)
            ]
            assert_embedded_as_ingest_would(document)
        # Markdown (and HTML, parsed to Markdown) get heading paths; plain text the title.
        headers = {c.metadata["header"] for c in chunks_of(stored[0])}
        assert "Kitchen garden handbook\nTomatoes > Watering" in headers
        assert {c.metadata["header"] for c in chunks_of(stored[1])} == {"Notes"}
        assert "Shed page\nShed > Locks" in {c.metadata["header"] for c in chunks_of(stored[2])}
        assert all(c.metadata["kept"] == "yes" for c in chunks_of(stored[1]))
        if not PG_TEXTSEARCH:  # that backend indexes the text column itself
            assert fulltext_count(stored[0], "handbook") == len(chunks_of(stored[0]))
        # --collection kept to it; then the rest, and a second run finds nothing.
        assert all("header" not in c.metadata for c in chunks_of(untouched))
        other = len(chunks_of(untouched))
        assert maintenance.refresh_headers(apply=True) == {"documents": 1, "chunks": other}
        assert maintenance.refresh_headers() == {"documents": 0, "chunks": 0}
    assert [c.metadata["header"] for c in chunks_of(untouched)] == ["Other\nTomatoes"] * other

    with override_settings(DJANGO_RAG=OFF):
        assert maintenance.refresh_headers(apply=True)["chunks"] == 2 * total + other
        for document in [*stored, *reference, untouched]:
            assert all("header" not in c.metadata for c in chunks_of(document))
            assert_embedded_as_ingest_would(document)
        assert fulltext_count(stored[0], "handbook") == 0
        assert all(c.metadata["kept"] == "yes" for c in chunks_of(stored[1]))


@pytest.mark.django_db
def test_refresh_refuses_an_unknown_collection_and_a_switch_under_way():
    with override_settings(DJANGO_RAG=ON), pytest.raises(UnknownCollection):
        maintenance.refresh_headers(collection="nowhere", apply=True)
    switching = {**ON, "NEXT_EMBEDDER": {"BACKEND": "hashing", "OPTIONS": {"dimensions": 384}}}
    with override_settings(DJANGO_RAG=switching), pytest.raises(InvalidInput, match="switch"):
        maintenance.refresh_headers(apply=True)


@pytest.mark.django_db(transaction=True)
def test_a_document_deleted_while_the_refresh_waits_for_its_lock_is_skipped():
    with override_settings(DJANGO_RAG=OFF):
        first, second = (
            rag.ingest(text, title=title, collection="garden")
            for text, title in (("Alpha text.", "Alpha"), ("Beta text.", "Beta"))
        )
    locked, release = threading.Event(), threading.Event()

    def delete_first():
        try:
            with transaction.atomic():
                Document.objects.select_for_update().get(pk=first.pk)
                locked.set()
                release.wait(30)
                Document.objects.filter(pk=first.pk).delete()
        finally:
            connection.close()

    worker = threading.Thread(target=delete_first)
    worker.start()
    assert locked.wait(30)
    timer = threading.Timer(1.0, release.set)  # the refresh is blocked on the lock by then
    timer.start()
    try:
        with override_settings(DJANGO_RAG=ON):
            counts = maintenance.refresh_headers(apply=True)
    finally:
        release.set()
        worker.join(30)
        timer.cancel()
    assert counts == {"documents": 1, "chunks": 1}
    assert not Document.objects.filter(pk=first.pk).exists()
    assert not Chunk.objects.filter(document_id=first.pk).exists()
    assert [c.metadata["header"] for c in chunks_of(second)] == ["Beta"]


@pytest.mark.django_db(transaction=True)
def test_a_refresh_racing_replacements_leaves_every_chunk_consistent():
    """A thread replaces documents (new text, new version) while the refresh runs: every
    chunk ends with the header its version should have and an embedding of exactly that
    header and text; no chunk is left without its document."""
    texts = [
        f"# Bed {i}\n\nRadishes in bed {i}.\n\n## Care\n\nWater bed {i} daily." for i in range(12)
    ]
    options = {"collection": "garden", "chunk_size": 20, "chunk_overlap": 0, "format": "markdown"}
    with override_settings(DJANGO_RAG=OFF):
        for i, text in enumerate(texts):
            rag.ingest(text, source_id=f"bed-{i}", title=f"Bed {i}", **options)
    errors, during = [], []
    refreshing, finished = threading.Event(), threading.Event()
    apply_headers = maintenance._apply_headers

    def slow_apply(*args):  # the refresh, a document at a time, leaves room between them
        refreshing.set()
        try:
            return apply_headers(*args)
        finally:
            time.sleep(0.1)

    def replace_some():
        try:
            refreshing.wait(30)
            for round_ in range(3):
                for i in range(0, 12, 2):
                    text = texts[i] + f"\n\nRound {round_}: mulch bed {i}."
                    rag.ingest(
                        text, source_id=f"bed-{i}", title=f"Bed {i}", replace=True, **options
                    )
                    during.append(not finished.is_set())
        except Exception as exc:  # reported below: the thread's failure fails the test
            errors.append(exc)
        finally:
            connection.close()

    with (
        override_settings(DJANGO_RAG=ON),
        mock.patch.object(maintenance, "_apply_headers", slow_apply),
    ):
        worker = threading.Thread(target=replace_some)
        worker.start()
        try:
            maintenance.refresh_headers(apply=True)
        finally:
            finished.set()
            refreshing.set()
            worker.join(120)
        assert any(during), "no replacement ran while the refresh did"
        assert not errors, errors
        assert maintenance.refresh_headers() == {"documents": 0, "chunks": 0}
        assert Document.objects.filter(collection__name="garden").count() == 12
    chunks = Chunk.objects.filter(collection__name="garden").select_related("document")
    assert all(c.metadata["header"].startswith(c.document.title) for c in chunks)
    for document in Document.objects.filter(collection__name="garden"):
        assert_embedded_as_ingest_would(document)


@pytest.mark.django_db
def test_the_command_reports_a_dry_run_then_applies():
    with override_settings(DJANGO_RAG=OFF):
        document = rag.ingest(GUIDE, format="markdown", title="Guide", collection="garden")
    count = len(chunks_of(document))
    with override_settings(DJANGO_RAG=ON):
        out = StringIO()
        call_command("rag_maintenance", "headers", stdout=out)
        assert f"Found {count} chunk header(s) in 1 document(s) not matching" in out.getvalue()
        assert "Dry run" in out.getvalue()
        out = StringIO()
        call_command("rag_maintenance", "headers", "--collection", "garden", "--apply", stdout=out)
        assert f"Rebuilt {count} chunk header(s) in 1 document(s)" in out.getvalue()
        assert all(c.metadata["header"].startswith("Guide") for c in chunks_of(document))
        with pytest.raises(CommandError, match="nowhere"):
            call_command("rag_maintenance", "headers", "--collection", "nowhere")


def test_parser_formats_name_what_each_builtin_parser_hands_the_chunker():
    formats = parser_formats()
    assert formats["text/plain"] == "text"
    assert formats["application/pdf"] == "text"
    for content_type in (
        "text/markdown",
        "text/html",
        "text/csv",
        "message/rfc822",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ):
        assert formats[content_type] == "markdown", content_type


def test_text_given_to_ingest_keeps_its_format_whatever_parser_reads_such_files():
    from django_rag.ingestion.parsers import Parser

    class PlainMarkdownFiles(Parser):  # a project's parser, without the format attribute
        content_type = "text/markdown"

    with override_settings(DJANGO_RAG={"PARSERS": {".md": PlainMarkdownFiles}}):
        formats = parser_formats()
    assert formats["text/markdown"] == "markdown" and formats["text/html"] == "markdown"
