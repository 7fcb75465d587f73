"""Commands start fast: run as a user runs them (a fresh Python process), they import no
model library they do not need, check their input before any model loads, and keep stdout
for their output. Timings are in benchmarks/command_timing.py, not here."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

import django_rag as rag
from django_rag.apps import management_command, preloads_here

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"torch", "transformers", "sentence_transformers", "litellm"}

# manage.py, plus a report of the heavy top-level packages imported, written at exit (after
# a CommandError too), to the file named by $MODULES_OUT.
MANAGE = """
import atexit, json, os, sys
HEAVY = set(os.environ["HEAVY_MODULES"].split(","))
def report():
    loaded = sorted({name.split(".")[0] for name in sys.modules} & HEAVY)
    with open(os.environ["MODULES_OUT"], "w") as out:
        json.dump(loaded, out)
atexit.register(report)
sys.argv[0] = "manage.py"
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
"""


@pytest.fixture
def manage(tmp_path):
    """Run ``manage.py ARGS`` in a new process on the test database with the real MiniLM;
    returns (exit status, stdout, stderr, heavy packages imported)."""

    def run(*args, **env):
        modules = tmp_path / "modules.json"
        done = subprocess.run(
            [sys.executable, "-c", MANAGE, *args],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
                "DJANGO_RAG_TEST_EMBEDDER": "local",
                "MODULES_OUT": str(modules),
                "HEAVY_MODULES": ",".join(sorted(HEAVY)),
                **env,
            },
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done.returncode, done.stdout, done.stderr, set(json.loads(modules.read_text()))

    return run


@pytest.fixture
def corpus(transactional_db):
    # Committed (transactional_db), so the command's own connection sees it.
    rag.ingest("Refunds are processed within five business days.", collection="kb")
    rag.ingest("Shipping is free above fifty euros.", collection="kb")


@pytest.mark.slow
def test_fulltext_search_imports_no_model_library(manage, corpus):
    status, out, err, heavy = manage("rag_search", "refunds", "--mode", "fulltext")
    assert status == 0, err
    assert "Refunds are processed" in out
    assert heavy == set(), heavy
    assert "loading model" not in err


@pytest.mark.slow
def test_unknown_collection_fails_before_any_model_loads(manage, corpus):
    for command in (
        ["rag_search", "refunds", "--collection", "missing"],
        ["rag_search", "refunds", "--mode", "hybrid", "--collection", "kb", "--collection", "x"],
        ["rag_ask", "why?", "--collection", "missing", "--llm", "openai/never-called"],
    ):
        status, out, err, heavy = manage(*command)
        assert status == 1, (command, err)
        assert "No collection named" in err
        assert "loading model" not in err
        assert not heavy & {"torch", "transformers", "sentence_transformers"}, (command, heavy)
        assert out == ""


@pytest.mark.slow
def test_semantic_json_is_pure_json_and_the_model_load_is_one_stderr_line(manage, corpus):
    status, out, err, heavy = manage("rag_search", "refund policy", "--json", "--limit", "2")
    assert status == 0, err
    data = json.loads(out)  # nothing else on stdout
    assert len(data) == 2 and {"chunk_id", "score", "text"} <= set(data[0])
    assert err.splitlines() == ["loading model all-MiniLM-L6-v2 ..."]
    # A query through the bundled model runs in numpy: no torch, transformers or
    # sentence-transformers in a search process.
    assert heavy == set(), heavy

    status, out, err, _ = manage("rag_search", "refund policy", "--json", "-v", "0")
    assert status == 0 and json.loads(out) and err == ""


@pytest.mark.slow
def test_sentence_transformers_loads_without_progress_bars(manage, corpus):
    status, out, err, heavy = manage(
        "rag_search",
        "refund policy",
        "--json",
        DJANGO_RAG_TEST_EMBEDDER="tests.embedders.SentenceTransformersMiniLM",
    )
    assert status == 0, err
    assert json.loads(out)
    # No "Loading weights: 100%|...|" bar, no download bar: one line.
    assert err.splitlines() == ["loading model all-MiniLM-L6-v2 ..."], err
    assert {"torch", "transformers", "sentence_transformers"} <= heavy


@pytest.mark.slow
def test_preload_models_in_a_served_process_not_in_commands(manage, tmp_path, db):
    modules = tmp_path / "served.json"
    # A WSGI server imports the project's WSGI module: django.setup() outside manage.py.
    served = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, json, os, sys; django.setup(); "
            "from django_rag.embeddings import configured_embedder as c; "
            "json.dump([c('EMBEDDER').is_loaded, "
            "sorted(m for m in sys.modules if m in ('torch', 'transformers'))], "
            "open(os.environ['MODULES_OUT'], 'w'))",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DJANGO_RAG_TEST_EMBEDDER": "local",
            "DJANGO_RAG_TEST_PRELOAD": "1",
            "MODULES_OUT": str(modules),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert served.returncode == 0, served.stderr
    # Loaded, and torch warm for document batches; sentence-transformers never needed.
    assert json.loads(modules.read_text()) == [True, ["torch"]]
    status, _, err, heavy = manage("rag_info", DJANGO_RAG_TEST_PRELOAD="1")
    assert status == 0, err
    assert "torch" not in heavy


@pytest.mark.parametrize(
    "argv,environ,expected",
    [
        (["gunicorn", "project.wsgi"], {}, True),
        (["/venv/bin/uvicorn", "project.asgi:application"], {}, True),
        (["manage.py", "runserver"], {}, False),  # the autoreloader's parent
        (["manage.py", "runserver"], {"RUN_MAIN": "true"}, True),
        (["manage.py", "runserver", "--noreload"], {}, True),
        (["manage.py", "rag_search", "x"], {}, False),
        (["/usr/bin/django-admin", "migrate"], {}, False),
        (["/venv/lib/python3.11/site-packages/django/__main__.py", "shell"], {}, False),
        (["/venv/bin/celery", "-A", "project", "worker"], {}, False),
    ],
)
def test_which_processes_preload(argv, environ, expected):
    assert preloads_here(argv, environ) is expected


def test_management_command_name():
    assert management_command(["manage.py"]) == "help"
    assert management_command(["manage.py", "rag_ingest", "x"]) == "rag_ingest"
    assert management_command(["gunicorn"]) is None
    assert management_command([]) is None


def test_worker_preload_follows_the_setting_and_the_pool(settings):
    from django_rag.tasks import preload_in_worker

    loaded = []

    class Recording:
        model_name = "recording"

        def preload(self):
            loaded.append(self.model_name)

    class Controller:
        def __init__(self, pool):
            self.pool_cls = pool

    import django_rag.embeddings as embeddings

    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "PRELOAD_MODELS": False}
    embeddings._default["EMBEDDER"] = Recording()
    preload_in_worker(sender="worker1@host")
    assert loaded == []
    settings.DJANGO_RAG = {"EMBEDDER": "hashing", "PRELOAD_MODELS": True}
    embeddings._default["EMBEDDER"] = Recording()  # after the settings change cleared it
    preload_in_worker(sender="worker1@host")  # worker_process_init: prefork child, solo
    assert loaded == ["recording"]
    preload_in_worker(sender=Controller("prefork"))  # worker_init in a prefork parent
    preload_in_worker(sender=Controller("solo"))
    assert loaded == ["recording"]
    preload_in_worker(sender=Controller("threads"))  # no process signal: preloads here
    assert loaded == ["recording", "recording"]


@pytest.mark.django_db
def test_search_checks_collections_before_an_unloaded_model_embeds(hashing):
    from django_rag.exceptions import UnknownCollection
    from django_rag.testing import HashingEmbedder

    calls = []

    class Cold(HashingEmbedder):
        """Pretends its model is not loaded yet: embedding would take seconds."""

        is_loaded = False

        def _embed(self, texts):
            calls.append(texts)
            return super()._embed(texts)

    rag.ingest("Refunds take five days.", collection="kb", embedder=hashing)
    for mode in ("semantic", "hybrid"):
        with pytest.raises(UnknownCollection):
            rag.search("refunds", mode=mode, collection=["kb", "missing"], embedder=Cold())
    assert calls == []
    assert rag.search("refunds", mode="semantic", collection="kb", embedder=Cold())
    assert len(calls) == 1


def test_a_model_load_is_one_event_with_progress_bars_off(events, monkeypatch):
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    from django_rag import utils
    from django_rag.embeddings.loading import load_model

    monkeypatch.setattr(utils, "_loaded", {})
    # scripts/bootstrap.sh exports HF_HUB_DISABLE_PROGRESS_BARS=1, which the hub reads once at
    # import and which then overrides enable_progress_bars(): act as a fresh environment.
    hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")
    monkeypatch.setattr(hub_tqdm, "HF_HUB_DISABLE_PROGRESS_BARS", None)
    seen = []

    def loader():
        seen.append((hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()))
        return object()

    # Bars on, as in a fresh process (an earlier test or library may have turned them off).
    was = hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()
    hf_logging.enable_progress_bar()
    hub.enable_progress_bars()
    try:
        first = load_model(("test", "m"), loader, model="some/model", kind="embedder")
        assert load_model(("test", "m"), loader, model="some/model", kind="embedder") is first
        assert seen == [(False, True)]  # bars off while loading...
        assert hf_logging.is_progress_bar_enabled()  # ...and back on after
        assert not hub.are_progress_bars_disabled()
    finally:
        if not was[0]:
            hf_logging.disable_progress_bar()
        if was[1]:
            hub.disable_progress_bars()
    loads = [(kind, m["model"], m["kind"]) for kind, name, m in events if name == "model.load"]
    assert loads == [("start", "some/model", "embedder"), ("stop", "some/model", "embedder")]


def test_commands_announce_model_loads_on_stderr_only():
    from io import StringIO

    from django_rag.management.progress import announce_model_loads
    from django_rag.signals import span

    err = StringIO()
    with announce_model_loads(lambda: err):
        with span("model.load", model="all-MiniLM-L6-v2", kind="embedder"):
            pass
        with span("embed", model="all-MiniLM-L6-v2", count=1):
            pass
    with span("model.load", model="after", kind="embedder"):  # disconnected
        pass
    with announce_model_loads(lambda: err, enabled=False):
        with span("model.load", model="quiet", kind="embedder"):
            pass
    assert err.getvalue() == "loading model all-MiniLM-L6-v2 ...\n"


@pytest.fixture
def unmigrated_database(db):
    """An empty database on the test server, as a project has before ``migrate``."""
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    with connection._nodb_cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cursor.execute(f'CREATE DATABASE "{name}"')
    yield name
    with connection._nodb_cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["rag_search", "refunds", "--mode", "fulltext"],
        ["rag_search", "refunds"],
        ["rag_info"],
        ["rag_ingest", "README.md", "--collection", "kb"],
        ["rag_maintenance", "orphans"],
        ["rag_maintenance", "vector-index"],
        ["rag_maintenance", "fulltext-index"],
    ],
)
def test_a_command_before_migrate_says_to_run_migrate(manage, unmigrated_database, command):
    status, out, err, _ = manage(*command, DJANGO_RAG_TEST_DATABASE=unmigrated_database)
    assert status == 1, (out, err)
    assert "The django_rag tables do not exist yet: run python manage.py migrate" in err, err
    assert "Traceback" not in err, err


def test_only_a_missing_django_rag_table_means_not_migrated():
    from django.db import ProgrammingError

    from django_rag.management.progress import not_migrated

    class UndefinedTable(Exception):
        sqlstate = "42P01"

    def wrapped(message):
        try:
            try:
                raise UndefinedTable(message)
            except UndefinedTable as cause:
                raise ProgrammingError(message) from cause
        except ProgrammingError as error:
            return error

    assert not_migrated(wrapped('relation "django_rag_chunk" does not exist'))
    assert not not_migrated(wrapped('relation "shop_product" does not exist'))
