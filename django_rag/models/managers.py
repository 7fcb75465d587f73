"""Query methods for chunks: the search modes live here."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from django.db import connections, models, transaction
from django.db.models import F, Value
from pgvector.django import CosineDistance

from ..conf import search_setting

_pgvector_versions: dict[str, tuple[int, ...]] = {}


def pgvector_version(using: str = "default") -> tuple[int, ...]:
    """The installed pgvector extension version, e.g. (0, 6, 2); () when it is missing."""
    if using not in _pgvector_versions:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cursor.fetchone()
        version = tuple(int(part) for part in row[0].split(".") if part.isdigit()) if row else ()
        if not version:
            return ()
        _pgvector_versions[using] = version
    return _pgvector_versions[using]


class ChunkQuerySet(models.QuerySet):
    def semantic(
        self, vector: Sequence[float], *, limit: int, threshold: float | None = None
    ) -> list:
        """The ``limit`` chunks of this queryset nearest to ``vector`` (cosine), best first.

        Each chunk gets ``score`` (cosine similarity, 1 is identical) and keeps only rows with
        ``score >= threshold``. Any filter already on the queryset is honoured *completely*:
        the result has min(limit, matching rows) chunks. pgvector applies filters after the
        HNSW scan, so a selective filter could otherwise return almost nothing. A filter that
        matches at most ``SEARCH["EXACT_SEARCH_MAX_ROWS"]`` chunks is answered by an exact scan
        through the filter's index; a larger one uses the HNSW index (iterative scans on
        pgvector >= 0.8, else a candidate list widened by the filter's estimated selectivity)
        and falls back to an exact scan if the index returns too few rows.
        """
        base = (
            self.annotate(distance=CosineDistance("embedding", vector))
            .select_related("document", "collection")
            .defer("embedding", "search_vector", "document__content")
        )
        if self.query.where:
            cap = search_setting("EXACT_SEARCH_MAX_ROWS")
            if self._count_upto(cap + 1) <= cap:
                rows = self._exact(base, limit)
            else:
                rows = self._approximate(base, limit, selectivity=self._selectivity())
        else:
            rows = self._approximate(base, limit, selectivity=None)
        if len(rows) < limit and self._count_upto(limit) > len(rows):
            rows = self._exact(base, limit)
        for row in rows:
            row.score = 1.0 - float(row.distance)
        if threshold is not None:
            rows = [row for row in rows if row.score >= threshold]
        return rows

    def _count_upto(self, cap: int) -> int:
        return self.order_by().values("pk")[:cap].count()

    def _exact(self, base, limit: int) -> list:
        # Ordering by an expression the HNSW index cannot serve forces an exact scan over the
        # rows the filter selects (found through the filter's own B-tree index).
        return list(base.order_by(F("distance") + Value(0.0), "pk")[:limit])

    def _selectivity(self) -> float:
        """Planner estimate of the share of chunks this queryset's filter keeps (0..1]."""
        plan = json.loads(self.order_by().values("pk").explain(format="json"))
        matching = float(plan[0]["Plan"]["Plan Rows"])
        with connections[self.db].cursor() as cursor:
            cursor.execute(
                "SELECT reltuples FROM pg_class WHERE oid = %s::regclass",
                [self.model._meta.db_table],
            )
            total = float(cursor.fetchone()[0])
        if total <= 0 or matching >= total:
            return 1.0
        return max(matching / total, 1e-6)

    def _approximate(self, base, limit: int, *, selectivity: float | None) -> list:
        ef_search = max(int(search_setting("HNSW_EF_SEARCH")), limit)
        iterative = selectivity is not None and pgvector_version(self.db) >= (0, 8)
        if selectivity is not None and not iterative:
            # The filter is applied after the scan: widen the candidate list so that about
            # twice `limit` candidates are expected to pass it (the exact fallback covers misses).
            ef_search = max(ef_search, math.ceil(2 * limit / selectivity))
        with transaction.atomic(using=self.db), connections[self.db].cursor() as cursor:
            cursor.execute(
                "SELECT set_config('hnsw.ef_search', %s, true)", [str(min(ef_search, 1000))]
            )
            if iterative:
                cursor.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
            rows = list(base.order_by("distance")[:limit])
        # relaxed_order may return neighbours slightly out of order.
        rows.sort(key=lambda row: (row.distance, row.pk))
        return rows
