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

import contextlib
import math
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connections, router, transaction

from ..conf import search_setting, statement_timeout
from ..exceptions import ConfigurationError, InvalidOption, SearchTimeout

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


# PostgreSQL's SQLSTATE for a statement cancelled by statement_timeout (or a cancel request).
_QUERY_CANCELED = "57014"


@contextlib.contextmanager
def search_budget(using: str):
    """Run one search's statements on ``using`` under ``SEARCH["STATEMENT_TIMEOUT"]``: a
    statement that runs longer is cancelled and :class:`~django_rag.exceptions.SearchTimeout`
    raised. Nothing is done when the setting is None (the default).

    The timeout is ``SET LOCAL`` in a transaction of its own (a savepoint inside the caller's),
    and put back as it was before the search returns: inside a caller's transaction a
    released savepoint would otherwise keep it for the caller's later statements."""
    seconds = statement_timeout()
    if seconds is None:
        yield
        return
    connection = connections[using]
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'), "
                "set_config('statement_timeout', %s, true)",
                [f"{max(1, math.ceil(seconds * 1000))}ms"],
            )
            previous = cursor.fetchone()[0]
        try:
            yield
        except OperationalError as exc:
            cause = exc.__cause__
            if (getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)) in (
                _QUERY_CANCELED,
            ):
                raise SearchTimeout(seconds, database=using) from exc
            raise
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
