"""The state of a data directory and recovering from a crash: pid files of servers that are gone,
processes of a killed server that still hold its shared memory, and a first start killed during
initdb.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from ..exceptions import EmbeddedDataDirectoryError, EmbeddedServerNotReady

logger = logging.getLogger(__name__)


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


def check_is_directory(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise EmbeddedDataDirectoryError(
            f"The embedded PostgreSQL data directory {path} is a file, not a directory. Give "
            "embedded_database() the path of a directory (absent or empty: the server creates "
            "its data there), or move the file away.",
            path=path,
            problem="not_a_directory",
        )


def check_contents(path: Path) -> None:
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
    read_handle_pids(path)


def read_handle_pids(path: Path) -> list[int]:
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


def settle_pid_file(pgdata: Path) -> tuple[str, int | None]:
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


def recover_unfinished_initdb(path: Path) -> None:
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


def pid_file_status(pgdata: Path) -> str:
    lines = _read_pid_file(pgdata) or []
    return lines[7].strip() if len(lines) > 7 else ""
