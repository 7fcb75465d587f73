"""Writers and readers in real threads against real PostgreSQL.

- 8 writers replace and delete overlapping identities for ``DJANGO_RAG_TEST_STRESS_SECONDS``
  (default 30 s) while a ninth creates, fills, empties and deletes collections: no deadlock or
  other database error reaches a caller, no write is lost, one document per identity, the BM25
  statistics equal a recount in every collection, and no deleted collection leaves any behind.
- A search racing deletes never raises.
- A delete holding its transaction open does not block an ingest into another collection
  (the statistics are appended, not updated in place).
"""

import os
import random
import threading
import time

import pytest
from django.db import connection, connections, transaction

import django_rag as rag
from django_rag.exceptions import DocumentNotFound
from django_rag.models import (
    Chunk,
    Collection,
    CorpusDelta,
    CorpusStatistic,
    Document,
    SourceVersion,
    TermDelta,
    TermStatistic,
)
from django_rag.store import compact_statistics, delete_documents
from tests.helpers import assert_statistics_exact

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SECONDS = float(os.environ.get("DJANGO_RAG_TEST_STRESS_SECONDS", "30"))
WORDS = "refund parcel harbour station ledger invoice courier warranty voucher tariff".split()


def text_for(rng: random.Random, version: int) -> str:
    sentences = [
        " ".join(rng.choice(WORDS) for _ in range(12)) + f" version{version}."
        for _ in range(rng.randint(2, 30))
    ]
    return "\n\n".join(sentences)


def run_threads(count, body):
    errors = []

    def target(index):
        try:
            body(index)
        except BaseException as exc:  # reported below, with the thread's index
            errors.append((index, exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_eight_writers_replacing_and_deleting_overlapping_identities():
    identities = [f"id-{i}" for i in range(10)]
    deadline = time.monotonic() + SECONDS
    written = []  # (identity, content) of every write that returned
    lock = threading.Lock()
    counts = {"replace": 0, "delete": 0, "not_found": 0, "superseded": 0}

    def writer(index):
        rng = random.Random(index)
        version = 0
        while time.monotonic() < deadline:
            identity = rng.choice(identities)
            version += 1
            if rng.random() < 0.75:
                text = text_for(rng, version) + f" writer{index}"
                document = rag.ingest(
                    text,
                    collection=rng.choice(["a", "b"]),
                    source_id=identity,
                    replace=True,
                    chunk_size=20,
                    chunk_overlap=0,
                )
                if document.superseded:
                    # Submitted before another writer's version of the identity that was
                    # stored first: the newer one stays (and is returned), this one is not.
                    with lock:
                        counts["superseded"] += 1
                    continue
                assert document.chunk_count == Chunk.objects.filter(document=document).count() or (
                    not Document.objects.filter(pk=document.pk).exists()  # replaced meanwhile
                )
                with lock:
                    written.append((document.collection.name, identity, text))
                    counts["replace"] += 1
            else:
                found = list(
                    Document.objects.filter(source_id=identity).values_list("pk", flat=True)[:1]
                )
                try:
                    rag.delete(found[0] if found else -1)
                    with lock:
                        counts["delete"] += 1
                except DocumentNotFound:
                    with lock:
                        counts["not_found"] += 1

    def churner(index):
        # Collections come and go while the writers' compactions run: a delete waits for the
        # compaction lock, so no compactor folds a deleted collection's deltas back in.
        rng = random.Random(index)
        while time.monotonic() < deadline:
            name = f"tmp-{counts['collections']}"
            document = rag.ingest(text_for(rng, 0), collection=name, chunk_size=20, chunk_overlap=0)
            rag.delete(document)
            Collection.objects.get(name=name).delete()
            with lock:
                counts["collections"] += 1

    counts["collections"] = 0
    errors = run_threads(9, lambda i: (writer if i < 8 else churner)(i))
    assert errors == [], errors[:3]
    assert counts["replace"] > 50 and counts["delete"] > 5 and counts["collections"] > 5, counts
    # One document per (collection, identity); each holds text some writer wrote, whole.
    seen = set()
    texts = {(c, i): set() for c, i, _ in written}
    for collection, identity, text in written:
        texts[(collection, identity)].add(text)
    for document in Document.objects.select_related("collection"):
        key = (document.collection.name, document.source_id)
        assert key not in seen
        seen.add(key)
        assert document.status == "completed"
        assert document.content in texts[key]
        assert document.chunks.count() == document.chunk_count > 0
        # No write older than the identity's last replace was stored after it.
        fence = SourceVersion.objects.get(collection=document.collection, source_id=key[1])
        assert document.version == fence.version
    assert not Chunk.objects.exclude(document__in=Document.objects.all()).exists()
    assert_statistics_exact(bounds="hold")
    compact_statistics()
    assert_statistics_exact(bounds="hold")
    live = set(Collection.objects.values_list("pk", flat=True))
    for model in (TermStatistic, CorpusStatistic, TermDelta, CorpusDelta):
        assert set(model.objects.values_list("collection_id", flat=True)) <= live, model


def test_a_search_racing_deletes_never_raises():
    for i in range(20):
        rag.ingest(text_for(random.Random(i), i), collection="race", source_id=f"r{i}")
    stop = threading.Event()

    def deleter(_):
        rng = random.Random(7)
        for round_ in range(40):
            ids = list(Document.objects.values_list("pk", flat=True))
            if ids:
                try:
                    rag.delete(rng.choice(ids))
                except DocumentNotFound:
                    pass
            rag.ingest(text_for(rng, round_ + 100), collection="race", source_id=f"n{round_}")
        stop.set()

    def searcher(_):
        modes = ["semantic", "fulltext", "hybrid"]
        while not stop.is_set():
            for mode in modes:
                for hit in rag.search("refund ledger courier", mode=mode, collection="race"):
                    assert hit.text

    # One deleter, two searchers.
    errors = run_threads(3, lambda i: (deleter if i == 0 else searcher)(i))
    assert errors == [], errors[:3]


def test_an_open_delete_does_not_block_other_collections():
    big = rag.ingest(
        "\n\n".join(f"Ledger line {i} about tariffs and vouchers." for i in range(600)),
        collection="big",
        chunk_size=12,
        chunk_overlap=0,
    )
    assert big.chunk_count > 100
    deleted = threading.Event()
    release = threading.Event()
    outcome = {}

    def hold_delete(_):
        with transaction.atomic():
            delete_documents([big.pk])
            deleted.set()
            release.wait(30)

    def ingest_elsewhere(_):
        deleted.wait(30)
        with connection.cursor() as cursor:
            # Fail instead of waiting if anything this ingest needs is locked by the delete.
            cursor.execute("SET lock_timeout = '3s'")
        start = time.monotonic()
        document = rag.ingest("Tariffs on vouchers changed.", collection="other")
        outcome["seconds"] = time.monotonic() - start
        outcome["chunks"] = document.chunk_count
        release.set()

    errors = run_threads(2, lambda i: (hold_delete if i == 0 else ingest_elsewhere)(i))
    release.set()
    assert errors == [], errors
    assert outcome["chunks"] == 1 and outcome["seconds"] < 3
    assert not Document.objects.filter(pk=big.pk).exists()
    assert_statistics_exact(bounds="hold")


def test_threads_sharing_the_real_model_ingest_without_errors(minilm, settings):
    """One MiniLM, its tokenizer shared by threads that chunk (offsets) and embed at once."""
    settings.DJANGO_RAG = {"EMBEDDER": minilm}
    rng = random.Random(3)
    texts = [text_for(rng, i) for i in range(48)]

    def writer(index):
        for text in texts[index::8]:
            document = rag.ingest(text, collection="model", chunk_size=40, chunk_overlap=5)
            assert document.chunk_count > 0

    errors = run_threads(8, writer)
    assert errors == [], errors[:3]
    assert Document.objects.filter(collection__name="model").count() == len(set(texts))
