"""Upgrading a data directory of an older PostgreSQL major version in place (``pg_upgrade`` with
the binaries of both versions), keeping the old files aside.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .binaries import (
    chown_to_user,
    data_directory_version,
    installed_binaries,
    run_command,
    server_major,
    server_package,
    version_mismatch,
)
from .recovery import settle_pid_file


@contextlib.contextmanager
def _temporary_server(bin_path: Path, pgdata: Path, user: str | None, socket_dir: Path):
    """A server on ``pgdata`` listening only on a socket in ``socket_dir``, stopped after."""
    log = socket_dir / "server.log"
    run_command(
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
        run_command([bin_path / "pg_ctl", "-w", "-D", pgdata, "-m", "fast", "stop"], user=user)


def _shut_down_cleanly(bin_path: Path, pgdata: Path, user: str | None, workdir: Path) -> bool:
    """Stop a server still running on ``pgdata``; recover one that was killed (pg_upgrade
    needs a cleanly shut down cluster). Returns whether data checksums are on."""
    settle_pid_file(pgdata)  # a pid file naming a zombie or another program: pg_ctl would signal it
    status = subprocess.run(
        [str(bin_path / "pg_ctl"), "-D", str(pgdata), "status"], capture_output=True, user=user
    )
    if status.returncode == 0:  # running (the old package leaves its server running)
        run_command([bin_path / "pg_ctl", "-w", "-D", pgdata, "-m", "fast", "stop"], user=user)
    control = run_command([bin_path / "pg_controldata", "-D", pgdata], user=user)
    if not re.search(r"Database cluster state:\s*shut down\s*$", control, re.M):
        with _temporary_server(bin_path, pgdata, user, workdir):
            pass
        control = run_command([bin_path / "pg_controldata", "-D", pgdata], user=user)
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
    data, server = data_directory_version(path), server_major(module)
    if data is None or data == server:
        return None
    binaries = installed_binaries(module)
    if data > server or data not in binaries or server not in binaries:
        raise version_mismatch(path, data, server, module)
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
    chown_to_user(workdir, user)
    chown_to_user(new_dir, user)
    try:
        checksums = _shut_down_cleanly(old_bin, path, user, workdir)
        run_command(
            [new_bin / "initdb", "--auth=trust", "--auth-local=trust", "--encoding=utf8"]
            + ["-U", "postgres", "-D", new_dir]
            + ([] if checksums else ["--no-data-checksums"]),
            user=user,
        )
        run_command(
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
                run_command([*psql, "-f", script], user=user, cwd=workdir)
    finally:
        shutil.rmtree(new_dir, ignore_errors=True)  # gone already unless something failed
        shutil.rmtree(workdir, ignore_errors=True)
    return kept
