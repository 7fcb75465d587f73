"""An embedded PostgreSQL + pgvector for development and tests (the ``embedded`` extra).

``embedded_database(path)`` starts (or reuses) a private server from the ``pgserver`` package
and returns a ``DATABASES`` entry for it::

    DATABASES = {"default": embedded_database(BASE_DIR / ".pgdata")}

Production should use a regular PostgreSQL server with pgvector.
"""

from __future__ import annotations

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
