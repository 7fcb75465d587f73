"""The embedded server's lifecycle: start (or reuse) the server of a data directory and return
its ``DATABASES`` entry, and stop it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qs, unquote, urlparse

from ..exceptions import EmbeddedDataDirectoryError, EmbeddedServerError, EmbeddedServerNotReady
from .binaries import (
    check_data_directory,
    data_directory_version,
    installed_binaries,
    run_command,
    server_major,
    server_package,
)
from .recovery import (
    START_TIMEOUT,
    check_contents,
    check_is_directory,
    pid_file_status,
    read_handle_pids,
    recover_unfinished_initdb,
    settle_pid_file,
)
from .upgrade import upgrade_data_directory


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
    check_is_directory(path)
    with _package_lock(module):
        recover_unfinished_initdb(path)
    if upgrade:
        upgrade_data_directory(path)
    check_data_directory(path)
    check_contents(path)
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


def _package_lock(module: ModuleType):
    """The inter-process lock the server package holds while it creates or starts a server."""
    return getattr(module.PostgresServer, "_lock", None) or contextlib.nullcontext()


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
            state, pid = settle_pid_file(path)
            status = pid_file_status(path)
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


def _why_not_ready(state: str, pid: int | None, status: str) -> str:
    if state == "held":
        return f"processes of its killed server (pid {pid}) still hold its shared memory"
    if pid is not None and pid < 0:
        return f"a single-user PostgreSQL, pid {-pid}, holds it"
    return f"its server, pid {pid}, is {status or 'in an unknown state'!r}"


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
    if (
        server is None
        or not pgdata.is_dir()
        or settle_pid_file(pgdata)[0] not in ("ours", "unknown")
    ):
        return False
    pids = read_handle_pids(pgdata)
    others = [pid for pid in pids if pid != os.getpid() and psutil.pid_exists(pid)]
    handles.write_text(json.dumps(others))
    if others:
        return False
    bin_path = installed_binaries(module)[data_directory_version(pgdata) or server_major(module)]
    run_command(
        [bin_path / "pg_ctl", "-w", "-D", pgdata, "-m", "fast", "stop"], user=server.system_user
    )
    return True


def stop_data_directory(path: str | Path) -> bool:
    """Stop the embedded server running on the data directory ``path``, from any process (the
    one that started it may be gone: ``runserver`` and ``manage.py`` leave it running so the
    next command starts at once). Returns False when no server runs there.

    A ``postmaster.pid`` naming a process that is not this directory's server (it exited, or
    its pid now belongs to another program) is removed, and that process left alone: pg_ctl
    would signal whatever process holds the pid."""
    pgdata = Path(path).resolve()
    check_is_directory(pgdata)
    if not pgdata.is_dir():
        return False
    state, pid = settle_pid_file(pgdata)
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
    bin_path = installed_binaries(module)[data_directory_version(pgdata) or server_major(module)]
    user = None
    if os.geteuid() == 0:  # run as root, the packages run postgres as the data's owner
        import pwd

        owner = pwd.getpwuid(pgdata.stat().st_uid).pw_name
        user = None if owner == "root" else owner
    run_command([bin_path / "pg_ctl", "-w", "-D", pgdata, "-m", "fast", "stop"], user=user)
    handles = pgdata / ".handle_pids.json"
    if handles.exists():
        handles.write_text("[]")
    return True


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
