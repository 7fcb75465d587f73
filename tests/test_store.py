"""The store's own guarantees: transient failures retried, partial embedding on request."""

import psycopg
import pytest
from django.db import OperationalError

import django_rag as rag
from django_rag.exceptions import EmbeddingFailed
from django_rag.models import Chunk, Document
from django_rag.store import rows as store_rows

pytestmark = pytest.mark.django_db(transaction=True)  # the store owns its transactions


def test_a_deadlock_reported_by_postgresql_is_retried_without_losing_the_write(monkeypatch):
    real = store_rows.insert_chunks
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # as PostgreSQL reports a deadlock victim
            raise OperationalError("deadlock detected") from psycopg.errors.DeadlockDetected()
        return real(*args, **kwargs)

    monkeypatch.setattr(store_rows, "insert_chunks", flaky)
    document = rag.ingest("Refunds take fourteen days.", collection="retry", source_id="r")
    assert len(calls) == 2
    assert Document.objects.get().pk == document.pk
    assert Chunk.objects.filter(document=document).count() == document.chunk_count == 1


def test_other_database_errors_are_not_retried(monkeypatch):
    def broken(*args, **kwargs):
        raise OperationalError("disk full")

    monkeypatch.setattr(store_rows, "insert_chunks", broken)
    with pytest.raises(OperationalError, match="disk full"):
        rag.ingest("Refunds take fourteen days.", collection="retry")
    assert not Document.objects.exists()


def test_skip_mode_stores_the_chunks_that_embed(failing_embedder):
    text = "\n\n".join(["Refunds take days.", "BROKEN chunk here.", "Parcels ship fast."])
    embedder = failing_embedder("BROKEN")
    with pytest.raises(EmbeddingFailed):
        rag.ingest(text, collection="skip", embedder=embedder, chunk_size=6, chunk_overlap=0)
    assert not Document.objects.exists()
    document = rag.ingest(
        text,
        collection="skip",
        embedder=embedder,
        chunk_size=6,
        chunk_overlap=0,
        on_chunk_error="skip",
    )
    stored = list(Chunk.objects.filter(document=document).values_list("chunk_index", "text"))
    assert document.skipped_chunks and all("BROKEN" not in text for _, text in stored)
    assert [index for index, _ in stored] == [
        i
        for i in range(len(stored) + len(document.skipped_chunks))
        if i not in document.skipped_chunks
    ]
    assert "skipped" in Document.objects.get(pk=document.pk).error


def test_a_bad_format_in_the_background_is_refused_before_anything_is_stored():
    from django_rag.exceptions import InvalidOption
    from django_rag.models import Job

    with pytest.raises(InvalidOption, match="format"):
        rag.ingest("Refunds.", collection="bg", format="rtf", background=True)
    assert not Document.objects.exists() and not Job.objects.exists()


def test_a_lost_connection_during_full_text_search_is_not_a_configuration_error(monkeypatch):
    """Tasks retry OperationalError; the ConfigurationError it used to become stopped them."""
    from django_rag.exceptions import ConfigurationError
    from django_rag.models import fulltext_query
    from django_rag.tasks import TRANSIENT

    rag.ingest("Refunds take fourteen days.", collection="ft")

    class Dropped:
        """The query-parsing connection, as after the server went away."""

        in_atomic_block = False  # autocommit, as a search outside a transaction runs

        def cursor(self):
            raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(fulltext_query, "connections", {"default": Dropped()})
    with pytest.raises(OperationalError) as caught:
        rag.search("refunds", collection="ft", mode="fulltext")
    assert not isinstance(caught.value, ConfigurationError)
    assert isinstance(caught.value, TRANSIENT)
