"""Semantic search in SQL: the chunks nearest a query vector, exact under a selectivity threshold,
through the HNSW index (widened, with a fallback) above it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence

from django.core.exceptions import EmptyResultSet
from django.db import connections, transaction
from django.db.models import F, Value
from pgvector.django import CosineDistance

from ..conf import search_setting, vector_index_type
from .result_rows import result_from_row, with_result_columns
from .vector_index import ranking_distance, require_supported, vector_literal

try:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3
except ImportError:  # pragma: no cover - psycopg not installed: no PostgreSQL backend either
    is_psycopg3 = False


_pgvector_versions: dict[str, tuple[int, ...]] = {}

# A ranking statement (SQL, params) -> the statement sent in its place (see _nearest).
Wrap = Callable[[str, list], tuple[str, list]]


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


def _several_statements_per_call(connection) -> bool:
    """Whether ``connection`` accepts several statements with parameters in one ``execute``:
    client-side parameter binding (psycopg 2, psycopg 3 without ``server_side_binding``)."""
    if connection.vendor != "postgresql":
        return False
    return not (is_psycopg3 and connection.settings_dict["OPTIONS"].get("server_side_binding"))


class SemanticSearch:
    """The semantic search methods of :class:`~django_rag.models.managers.ChunkQuerySet`."""

    def semantic(
        self, vector: Sequence[float], *, limit: int, threshold: float | None = None
    ) -> list:
        """The ``limit`` chunks of this queryset nearest to ``vector`` (cosine), best first.

        Each chunk gets ``score`` = ``semantic_score`` (cosine similarity, 1 is identical); only
        rows with ``score >= threshold`` are kept. See :meth:`semantic_hits` for how filters
        stay complete.
        """
        hits = self.semantic_hits(vector, limit=limit)
        if threshold is not None:
            hits = [hit for hit in hits if hit[1] >= threshold]
        return self.load_hits(hits, score_field="semantic_score")

    def semantic_hits(self, vector: Sequence[float], *, limit: int) -> list[tuple[int, float]]:
        """``(pk, cosine similarity)`` of the ``limit`` chunks nearest to ``vector``.

        Any filter already on the queryset is honoured *completely*: the result has
        min(limit, matching rows) hits. pgvector applies filters after the HNSW scan, so a
        selective filter could otherwise return almost nothing. A filter that matches at most
        ``SEARCH["EXACT_SEARCH_MAX_ROWS"]`` chunks is answered by an exact scan through the
        filter's index; a larger one uses the HNSW index (iterative scans on pgvector >= 0.8,
        else a candidate list widened by the filter's estimated selectivity) and falls back to
        an exact scan if the index returns too few rows.
        """
        return [(row[0], 1.0 - float(row[1])) for row in self._nearest(vector, limit)]

    def semantic_results(
        self, vector: Sequence[float], *, limit: int, threshold: float | None = None
    ) -> list:
        """:meth:`semantic` as :class:`~django_rag.results.SearchResult` objects, read in the
        ranking query itself: an unfiltered search is one round trip to the database (the
        ``hnsw.ef_search`` setting travels with it), a filtered one adds the count that picks
        the exact scan. Same rows, order and completeness as :meth:`semantic_hits`."""
        results = []
        for row in self._nearest(vector, limit, wrap=self._with_result_columns):
            score = 1.0 - float(row[1])  # row[1]: the cosine distance
            if threshold is None or score >= threshold:
                results.append(result_from_row(row, score=score, semantic_score=score))
        return results

    def _nearest(
        self, vector: Sequence[float] | str, limit: int, *, wrap: Wrap | None = None, ranked=len
    ) -> list:
        """Rows ``(pk, cosine distance)`` of the ``limit`` nearest chunks, nearest first;
        complete under any filter (see :meth:`semantic_hits`). ``vector``: the query's vector
        or its text (:func:`.vector_index.vector_literal`).

        ``wrap`` turns the ranking statement (SQL and params, rows ``pk, distance``) into the
        one that is sent, in the same round trip (the result columns joined, hybrid's
        scoring); ``ranked(rows)`` then says how many of its rows the ranking returned."""
        base = self._ranked(vector)
        if self.query.where:
            cap = search_setting("EXACT_SEARCH_MAX_ROWS")
            if self._count_upto(cap + 1) <= cap:
                rows = self._exact(base, limit, wrap=wrap)
            else:
                rows = self._approximate(base, limit, filtered=True, wrap=wrap)
        else:
            rows = self._approximate(base, limit, filtered=False, wrap=wrap)
        found = ranked(rows)
        if found < limit and self._count_upto(limit) > found:
            rows = self._exact(base, limit, wrap=wrap)
        return rows

    def _with_result_columns(self, sql: str, params: list) -> tuple[str, list]:
        return with_result_columns(self.model, sql), params

    def _ranked(self, vector: Sequence[float] | str):
        """This queryset with ``distance`` and ``rank`` to ``vector``. ``distance`` (full
        precision) is what a hit reports and the exact scan ranks by; ``rank`` is the distance
        the HNSW index holds, which an index scan must order by for the planner to use the
        index: the same for a ``"vector"`` index, ``embedding::halfvec(n) <=>
        query::halfvec(n)`` for ``"halfvec"`` (``VECTOR_INDEX_TYPE``)."""
        literal = vector_literal(vector)  # written once, whatever reads it
        base = self.annotate(distance=CosineDistance("embedding", Value(literal)))
        if vector_index_type() == "vector":
            return base.annotate(rank=F("distance"))
        # A typed error where pgvector has no halfvec (before 0.7), not a failing query.
        require_supported("halfvec", pgvector_version(self.db))
        return base.annotate(rank=ranking_distance(literal))

    def _count_upto(self, cap: int) -> int:
        return self.order_by().values("pk")[:cap].count()

    def _exact(self, base, limit: int, *, wrap: Wrap | None = None) -> list:
        # Ordering by an expression the HNSW index cannot serve forces an exact scan over the
        # rows the filter selects (found through the filter's own B-tree index).
        ranked = base.order_by(F("distance") + Value(0.0), "pk").values_list("pk", "distance")
        return self._fetch(ranked[:limit], wrap=wrap)

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

    def _approximate(self, base, limit: int, *, filtered: bool, wrap: Wrap | None = None) -> list:
        configured = (
            search_setting("HNSW_EF_SEARCH") if self._ef_search is None else self._ef_search
        )
        ef_search = max(int(configured), limit)
        iterative = filtered and pgvector_version(self.db) >= (0, 8)
        if filtered and not iterative:
            # The filter is applied after the scan: widen the candidate list so that about
            # twice `limit` candidates are expected to pass it (the exact fallback covers misses).
            # Iterative scans (pgvector >= 0.8) need no estimate, so they skip this probe.
            ef_search = max(ef_search, math.ceil(2 * limit / self._selectivity()))
        settings = [("hnsw.ef_search", str(min(ef_search, 1000)))]
        if iterative:
            settings.append(("hnsw.iterative_scan", "relaxed_order"))
        ranked = base.order_by("rank").values_list("pk", "distance")[:limit]
        rows = self._fetch(ranked, wrap=wrap, settings=settings)
        # relaxed_order may return neighbours slightly out of order; a halfvec index ranks by
        # half-precision distances: the hits are in the order of their full-precision ones.
        return sorted(rows, key=lambda row: (row[1], row[0]))

    def _fetch(self, ranked, *, wrap: Wrap | None = None, settings=()) -> list:
        """Run ``ranked`` (a ``values_list("pk", "distance")`` queryset), as ``wrap`` makes it
        (see :meth:`_nearest`), after setting the transaction-local ``settings``, in one round
        trip where the driver allows several statements in one call (client-side binding,
        Django's default)."""
        connection = connections[self.db]
        try:
            sql, params = ranked.query.get_compiler(using=self.db).as_sql()
        except EmptyResultSet:  # a filter that can match nothing (an empty IN list)
            return []
        if wrap is not None:
            sql, params = wrap(sql, list(params))
        prelude = "SELECT set_config(%s, %s, true); " * len(settings)
        prelude_params = [value for pair in settings for value in pair]
        if not settings:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchall()
        if _several_statements_per_call(connection):
            # A multi-statement call is one implicit transaction when autocommit is on, so the
            # settings end with it (inside an atomic block they last until it ends, as SET
            # LOCAL does).
            with connection.cursor() as cursor:
                cursor.execute(prelude + sql, [*prelude_params, *params])
                if is_psycopg3:  # psycopg 2 keeps only the last statement's rows
                    for _ in settings:
                        cursor.nextset()
                return cursor.fetchall()
        with transaction.atomic(using=self.db), connection.cursor() as cursor:
            cursor.execute(
                "SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(settings)), prelude_params
            )
            cursor.execute(sql, params)
            return cursor.fetchall()
