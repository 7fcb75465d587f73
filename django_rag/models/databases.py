"""Which database a search reads, and which one the store writes.

Searches may run on a read replica; writes never do. The search alias is, in this order:

1. ``DJANGO_RAG["SEARCH"]["DATABASE"]`` when it is set;
2. what the project's ``DATABASE_ROUTERS`` answer for ``db_for_read(Chunk)``;
3. ``"default"`` (Django's answer when no router decides).

The write alias is ``db_for_write(Chunk)`` (``"default"`` without routers). Everything one search
reads (collections, chunks, BM25 statistics, the graph, the embedding switch's job row) is read
through the search alias, so a search sees one consistent database.
"""

from __future__ import annotations

from django.db import connections, router

from ..conf import search_setting
from ..exceptions import ConfigurationError


def search_db() -> str:
    """The ``DATABASES`` alias searches read (see the module docstring for the order)."""
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
