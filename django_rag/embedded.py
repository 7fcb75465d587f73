"""An embedded PostgreSQL + pgvector for development and tests (the ``embedded`` extra).

``embedded_database(path)`` starts (or reuses) a private server from the ``pgserver`` package
and returns a ``DATABASES`` entry for it::

    DATABASES = {"default": embedded_database(BASE_DIR / ".pgdata")}

Production should use a regular PostgreSQL server with pgvector.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from .exceptions import MissingDependency


def embedded_database(
    path: str | Path, *, name: str = "postgres", keep_running: bool = True
) -> dict:
    """Start pgserver with its data directory at ``path`` and return Django settings for it.

    Keep ``path`` inside the project or the system temp dir, never under $HOME: run as root,
    pgserver runs postgres as another user and opens up the data directory's parents.
    """
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless here.
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:
        raise MissingDependency("pgserver", "embedded", "The embedded PostgreSQL") from exc
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(path, cleanup_mode=None if keep_running else "stop")
    settings = database_from_url(server.get_uri(name))
    settings["TEST"] = {"NAME": f"test_{name}"}
    return settings


def stop_embedded_server(path: str | Path) -> bool:
    """Stop the embedded server of ``path`` unless another live process still uses it.

    pgserver counts the processes holding a server in ``.handle_pids.json`` but never forgets
    one that died without cleaning up (a killed worker, an interrupted test run), so a server
    started with ``keep_running=False`` can outlive everyone. This drops dead holders and stops
    the server when no live process but this one remains. Returns True when it stopped it.
    """
    import psutil
    from pgserver import pg_ctl
    from pgserver.postgres_server import PostgresServer

    pgdata = Path(path).resolve()
    server = PostgresServer._instances.get(pgdata)
    handles = pgdata / ".handle_pids.json"
    if server is None or not (pgdata / "postmaster.pid").exists():
        return False
    pids = json.loads(handles.read_text()) if handles.exists() else []
    others = [pid for pid in pids if pid != os.getpid() and psutil.pid_exists(pid)]
    handles.write_text(json.dumps(others))
    if others:
        return False
    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=pgdata, user=server.system_user)
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


def database_settings(data_dir: str | Path) -> dict:
    """``DATABASE_URL`` when it is set, else the embedded server with data in ``data_dir``."""
    url = os.environ.get("DATABASE_URL")
    return database_from_url(url) if url else embedded_database(data_dir)
