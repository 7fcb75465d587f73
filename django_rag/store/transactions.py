"""What every writing transaction of the store shares: running it again after a deadlock or a
serialization failure, and folding the BM25 statistics deltas once it commits.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections, transaction

from ..models.databases import write_db
from .statistics import compact_statistics

logger = logging.getLogger(__name__)


T = TypeVar("T")


# SQLSTATEs worth another attempt: deadlock_detected, serialization_failure.
_RETRYABLE = {"40P01", "40001"}


ATTEMPTS = 5


def retry_transient(write: Callable[[], T], *, what: str) -> T:
    """Run ``write`` (which opens its own transaction) again when PostgreSQL aborts it with a
    deadlock or serialization failure. Inside a caller's transaction nothing can be retried:
    the error goes to the caller."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return write()
        except DatabaseError as exc:
            code = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
            in_atomic = connections[write_db()].in_atomic_block
            if code not in _RETRYABLE or in_atomic or attempt == ATTEMPTS:
                raise
            logger.warning("%s: %s, attempt %d of %d", what, code, attempt, ATTEMPTS)
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


def compact_on_commit(db: str | None = None) -> None:
    """Fold the statistics deltas on ``db`` (default: the write database) once the current
    transaction commits, or now when none is open."""
    db = db or write_db()
    transaction.on_commit(functools.partial(compact_statistics, using=db), using=db)
