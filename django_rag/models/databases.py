"""Which database a search reads, and which one the store writes.

Searches may run on a read replica; writes never do. The search alias is, in this order:

1. ``database=`` given to the call (``search``, ``ask``, the agent's search options);
2. ``DJANGO_RAG["SEARCH"]["DATABASE"]`` when it is set;
3. what the project's ``DATABASE_ROUTERS`` answer for ``db_for_read(Chunk)``;
4. ``"default"`` (Django's answer when no router decides).

The write alias is ``db_for_write(Chunk)`` (``"default"`` without routers). Everything one search
reads (collections, chunks, BM25 statistics, the graph, the embedding switch's job row) is read
through the search alias, so a search sees one consistent database.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connections, router

from ..conf import search_setting
from ..exceptions import ConfigurationError, InvalidOption

T = TypeVar("T")


def on_live_connection(alias: str, write: Callable[[], T]) -> T:
    """Run ``write``; when it fails because the connection was lost (the server restarted, the
    backend was terminated), run it once more on a fresh connection. What records a failure
    must outlive the connection the failure broke. Inside a transaction nothing is retried:
    the error goes to the caller, whose transaction is lost anyway."""
    try:
        return write()
    except (OperationalError, InterfaceError):
        connection = connections[alias]
        if connection.in_atomic_block:
            raise
        connection.close()  # the next query opens a new one
        return write()


def search_db(alias: str | None = None) -> str:
    """The ``DATABASES`` alias a search reads: ``alias`` when given (checked), else the
    setting, the routers or ``"default"`` (see the module docstring)."""
    if alias is not None:
        if not isinstance(alias, str) or alias not in connections.settings:
            raise InvalidOption(
                f"database must be an alias of DATABASES "
                f"({', '.join(sorted(connections.settings))}), got {alias!r}"
            )
        return alias
    alias = search_setting("DATABASE")
    if alias is None:
        from .documents import Chunk

        return router.db_for_read(Chunk)
    if not isinstance(alias, str) or alias not in connections.settings:
        raise ConfigurationError(
            "SEARCH.DATABASE",
            alias,
            "it must be None or an alias of DATABASES "
            f"({', '.join(sorted(connections.settings))}); system check django_rag.E010",
        )
    return alias


def write_db() -> str:
    """The ``DATABASES`` alias the store writes (and reads while it writes): never a replica
    unless the project's routers send writes there."""
    from .documents import Chunk

    return router.db_for_write(Chunk)
