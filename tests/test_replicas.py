"""Searches on a read replica (docs/scaling.md): every search path reads through the search
alias and writes nothing; the store keeps writing (and reading while it writes) on the primary.

The ``replica`` alias (tests/settings.py) is the test database through a connection whose every
transaction is read-only: a write attempted through it fails. It is a test mirror, a separate
connection that cannot see the default connection's uncommitted rows, so these tests commit
their data (``transaction=True``).
"""

import re

import pytest
from django.core import checks
from django.db import DatabaseError, connections
from django.test.utils import CaptureQueriesContext

import django_rag as rag
from django_rag.checks import check_search_database
from django_rag.evaluation import create_test_case, run_evaluation
from django_rag.exceptions import ConfigurationError, InvalidOption, UnknownCollection
from django_rag.graph import build_graph, detect_communities
from django_rag.models import Chunk, Document, Entity
from django_rag.models import managers as chunk_managers
from django_rag.models.databases import search_db, write_db
from tests.settings import LOCAL_GRAPH

both = pytest.mark.django_db(transaction=True, databases=["default", "replica"])

# SQL that writes, or that a hot standby refuses although it is no write (advisory locks).
WRITES = re.compile(
    r"^\s*(INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|TRUNCATE|LOCK)\b|FOR UPDATE|nextval|advisory",
    re.IGNORECASE,
)

# What only a search runs: vector distances, text search matches, the BM25 statistics.
SEARCH_SQL = re.compile(r"<=>|@@|django_rag_term|django_rag_corpus")

TEXTS = {
    "handbook": [
        "Acme Corporation ships the Falcon drill from Denver. Refunds take fourteen days. "
        "The Falcon drill has a brushless motor and two batteries. Support answers by email.",
        "Acme Corporation repairs the Falcon drill in Denver within a week. Warranty claims "
        "need the receipt. The Osprey saw shares its batteries with the Falcon drill.",
        "Globex Industries makes the Osprey saw in Lyon. Refunds for the Osprey saw take "
        "thirty days. The blade guard of the Osprey saw is sold separately.",
    ],
    "other": [
        "Initech prints reports in Austin. Refunds are not offered for printed reports.",
    ],
}


class ReplicaRouter:
    """Django's primary/replica pattern: django_rag reads from the replica, writes to default."""

    def db_for_read(self, model, **hints):
        return "replica" if model._meta.app_label == "django_rag" else None

    def db_for_write(self, model, **hints):
        return "default"

    def allow_relation(self, obj1, obj2, **hints):
        return True

    def allow_migrate(self, db, app_label, **hints):
        return db == "default"


def configure(settings, database=None, **extra):
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        # No gate: the hashing embedder's similarities are low, and the graph list must be
        # read (on the replica) for these tests.
        "GRAPH": {**LOCAL_GRAPH, "MATCH_THRESHOLD": 0.05, "MIN_MATCH_SCORE": 0.0},
        # Small, so that a search scoped to a collection takes the filtered HNSW path.
        "SEARCH": {"DATABASE": database, "EXACT_SEARCH_MAX_ROWS": 3},
        **extra,
    }


def ingest_corpus():
    for collection, texts in TEXTS.items():
        for i, text in enumerate(texts):
            rag.ingest(
                text,
                collection=collection,
                source_id=f"{collection}-{i}",
                metadata={"n": i},
                graph=True,
                chunk_size=12,
                chunk_overlap=0,
            )


@pytest.fixture
def corpus(settings):
    configure(settings)
    ingest_corpus()
    assert Chunk.objects.filter(collection__name="handbook").count() > 3
    assert Entity.objects.exists()


class Queries:
    """The SQL each connection ran inside the block."""

    def __enter__(self):
        self.contexts = {
            alias: CaptureQueriesContext(connections[alias]) for alias in ("default", "replica")
        }
        for context in self.contexts.values():
            context.__enter__()
        return self

    def __exit__(self, *exc):
        for context in self.contexts.values():
            context.__exit__(*exc)

    def __getitem__(self, alias):
        return [query["sql"] for query in self.contexts[alias].captured_queries]


def assert_read_on_replica(queries):
    assert queries["default"] == []
    assert queries["replica"]
    assert not [sql for sql in queries["replica"] if WRITES.search(sql)]


def ranked(results):
    return [
        (r.chunk_id, round(r.score, 6), r.semantic_score and round(r.semantic_score, 6))
        for r in results
    ]


SEARCHES = {
    "semantic": {"mode": "semantic"},
    "semantic, scoped (filtered HNSW)": {"mode": "semantic", "collection": "handbook"},
    "semantic, source filter (exact)": {"mode": "semantic", "source_id": "handbook-1"},
    "fulltext": {"mode": "fulltext"},
    "fulltext, scoped": {"mode": "fulltext", "collection": ["handbook", "other"]},
    "hybrid": {"mode": "hybrid", "collection": "handbook", "metadata": {"n": 0}},
    "hybrid, rrf": {"mode": "hybrid", "fusion": "rrf"},
    "graph": {"mode": "hybrid", "graph": True, "graph_depth": 1, "collection": "handbook"},
    "graph, ner matcher": {"mode": "fulltext", "graph": True, "entity_matcher": "ner"},
}


@both
@pytest.mark.parametrize("options", SEARCHES.values(), ids=SEARCHES.keys())
def test_every_search_mode_reads_the_replica_and_finds_what_default_finds(
    corpus, settings, options
):
    query = "Falcon drill refunds from Acme Corporation"
    on_default = rag.search(query, limit=4, **options)
    assert on_default
    configure(settings, "replica")
    with Queries() as queries:
        on_replica = rag.search(query, limit=4, **options)
    assert ranked(on_replica) == ranked(on_default)
    assert [r.graph_score for r in on_replica] == [r.graph_score for r in on_default]
    assert_read_on_replica(queries)
    if options.get("graph"):
        assert any(r.graph_score for r in on_replica)
        assert any("django_rag_entity" in sql for sql in queries["replica"])


@both
def test_the_filtered_hnsw_path_sets_its_parameters_on_the_read_only_replica(corpus, settings):
    """set_config(..., true) (SET LOCAL) inside the search's transaction is allowed in a
    read-only transaction: the filtered HNSW path, iterative scans included, runs there."""
    with connections["replica"].cursor() as cursor, pytest.raises(DatabaseError, match="read-only"):
        cursor.execute("CREATE TEMP TABLE replica_probe (id int)")
    configure(settings, "replica")
    with Queries() as queries:
        rag.search("Osprey saw blade", collection="handbook", limit=2)
    replica = queries["replica"]
    assert any("set_config('hnsw.ef_search'" in sql for sql in replica)
    explained = any(sql.startswith("EXPLAIN") for sql in replica)  # the filter's selectivity
    if chunk_managers.pgvector_version("replica") >= (0, 8):  # e.g. the PostgreSQL 18 bundle
        assert any("set_config('hnsw.iterative_scan'" in sql for sql in replica)
        assert not explained  # iterative scans need no selectivity estimate
    else:
        assert explained
    assert_read_on_replica(queries)


@both
def test_an_unknown_collection_is_refused_on_the_replica(corpus, settings):
    configure(settings, "replica")
    with Queries() as queries, pytest.raises(UnknownCollection):
        rag.search("refunds", collection=["handbook", "missing"])
    assert queries["default"] == [] and queries["replica"]


@both
def test_ingest_with_a_search_replica_writes_on_default(settings):
    configure(settings, "replica")
    with Queries() as queries:
        ingest_corpus()
        document = rag.ingest("Refunds take fourteen days.", collection="handbook")
        again = rag.ingest("Refunds take fourteen days.", collection="handbook")
        rag.delete(document)
    assert again.deduplicated and again.pk == document.pk
    assert queries["replica"] == []
    assert any(sql.startswith("INSERT") for sql in queries["default"])
    assert Document.objects.using("default").count() == sum(len(t) for t in TEXTS.values())
    assert rag.search("Falcon drill", limit=1)  # and the replica finds them


@both
def test_a_router_sends_searches_to_the_replica_and_writes_to_default(settings):
    configure(settings)
    settings.DATABASE_ROUTERS = [f"{__name__}.ReplicaRouter"]
    assert (search_db(), write_db()) == ("replica", "default")
    with Queries() as queries:
        # Replace and dedup read on the primary under the identity lock: a lagging replica
        # must not decide them. Nothing of the write path reads the replica.
        ingest_corpus()
        rag.ingest(TEXTS["other"][0] + " New.", collection="other", source_id="other-0",
                   replace=True, graph=True)  # fmt: skip
        duplicate = rag.ingest(TEXTS["handbook"][0], collection="handbook", source_id="handbook-0")
    assert duplicate.deduplicated
    assert queries["replica"] == []
    assert Document.objects.using("default").filter(source_id="other-0").count() == 1

    with Queries() as queries:  # graph rebuilds and communities read what they rewrite
        assert build_graph("handbook", resume=False)["chunks"] > 3
        detect_communities("handbook", seed=7, min_size=2)
    assert queries["replica"] == [] and queries["default"]

    with Queries() as queries:
        routed = {name: rag.search("Falcon drill refunds", limit=4, **o) for name, o in
                  SEARCHES.items()}  # fmt: skip
    assert_read_on_replica(queries)
    settings.DATABASE_ROUTERS = []
    configure(settings)
    for name, options in SEARCHES.items():
        assert ranked(routed[name]) == ranked(
            rag.search("Falcon drill refunds", limit=4, **options)
        )


@both
def test_the_explicit_setting_wins_over_the_router(settings):
    """Precedence: database= per call > SEARCH["DATABASE"] > db_for_read(Chunk) > default."""
    settings.DATABASE_ROUTERS = [f"{__name__}.ReplicaRouter"]
    configure(settings, "default")
    assert search_db() == "default"
    configure(settings, None)
    assert search_db() == "replica"
    assert search_db("default") == "default"  # a call's database= wins over both
    settings.DATABASE_ROUTERS = []
    assert search_db() == "default"


@both
def test_a_call_can_read_the_primary_while_searches_use_the_replica(corpus, settings):
    """Read-your-writes: database="default" per call wins over the setting."""
    configure(settings, "replica", LLM=lambda prompt: "Fourteen days [1].")
    with Queries() as queries:
        assert rag.search("Falcon drill", mode="hybrid", graph=True, database="default")
        assert rag.ask("Falcon drill refunds?", database="default").chunks
    assert queries["replica"] == [] and queries["default"]
    with pytest.raises(InvalidOption, match="replika"):
        rag.search("Falcon drill", database="replika")


@both
def test_ask_and_the_agent_retrieve_on_the_replica(corpus, settings):
    configure(settings, "replica", LLM=lambda prompt: "Fourteen days [1].")
    with Queries() as queries:
        answer = rag.ask("How long do Falcon drill refunds take?", collection="handbook")
    assert answer.chunks and answer.text
    assert_read_on_replica(queries)

    with Queries() as queries:
        answer = rag.ask("What does Acme Corporation ship?", graph=True, mode="hybrid")
    assert answer.graph and answer.graph["entities"]
    assert_read_on_replica(queries)

    with Queries() as queries:
        agent = (
            rag.Agent("Which saw shares the Falcon drill's batteries?", mode="hybrid")
            .select(selector=lambda question, offered, context=None: ["handbook"])
            .search()
        )
    assert agent.error is None and agent.chunks
    assert agent.context.collections == ["handbook"]
    assert_read_on_replica(queries)


@both
def test_evaluation_searches_on_the_replica_and_stores_its_run_on_default(corpus, settings):
    chunk = Chunk.objects.filter(text__contains="Osprey").first()
    create_test_case("Which saw has a blade guard?", chunks=[chunk.pk], collection="handbook")
    configure(settings, "replica")
    with Queries() as queries:
        run = run_evaluation(mode="hybrid")
    assert run.status == "completed" and run.metrics["recall_at_5"] == 1.0
    # Test cases and the run are read and written on default; the searches ran on the replica.
    assert not [sql for sql in queries["default"] if SEARCH_SQL.search(sql)]
    assert any(sql.startswith("INSERT") and "django_rag_run" in sql for sql in queries["default"])
    assert [sql for sql in queries["replica"] if SEARCH_SQL.search(sql)]
    assert not [sql for sql in queries["replica"] if WRITES.search(sql)]


@both
def test_the_dashboard_search_reads_the_replica(corpus, settings, staff):
    configure(settings, "replica")
    with Queries() as queries:
        response = staff.get("/tools/rag/search/", {"q": "Falcon drill refunds", "mode": "hybrid"})
    assert response.status_code == 200 and "Falcon" in response.content.decode()
    # The page's own figures (documents and chunks counted in the header) follow the routers;
    # the search ran on the replica.
    assert not [sql for sql in queries["default"] if SEARCH_SQL.search(sql)]
    assert [sql for sql in queries["replica"] if SEARCH_SQL.search(sql)]
    assert not [sql for sql in queries["replica"] if WRITES.search(sql)]


def test_the_check_refuses_an_unknown_alias(settings):
    settings.DJANGO_RAG = {"SEARCH": {"DATABASE": "replika"}}
    (error,) = check_search_database()
    assert error.id == "django_rag.E010" and "replika" in error.msg and "replica" in error.msg
    assert isinstance(error, checks.Error)
    with pytest.raises(ConfigurationError, match="SEARCH.DATABASE"):
        search_db()
    settings.DJANGO_RAG = {"SEARCH": {"DATABASE": "replica"}}
    assert check_search_database() == [] and search_db() == "replica"
    settings.DJANGO_RAG = {}
    assert check_search_database() == [] and search_db() == "default"
