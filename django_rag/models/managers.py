"""Query methods for chunks: the search modes live here (semantic and full-text in their own
modules, mixed into :class:`ChunkQuerySet`)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from django.db import connections, models

from ..fusion import fuse
from ..results import SearchResult
from .bm25 import bm25_sql, limit_terms, term_weights
from .fulltext_search import (  # noqa: F401 (the two constants are re-exported)
    FULLTEXT_CANDIDATE_BUDGET,
    INDEX_SCAN_MAX_WIDENING,
    FulltextSearch,
)
from .result_rows import result_from_row, with_result_columns
from .semantic_search import SemanticSearch, Wrap, pgvector_version  # noqa: F401 (re-exported)
from .textsearch import fulltext_backend, score_sql
from .vector_index import vector_literal


class ChunkQuerySet(SemanticSearch, FulltextSearch, models.QuerySet):
    """Chunks, with a method per search mode: semantic (:mod:`.semantic_search`), full-text
    (:mod:`.fulltext_search`) and hybrid (here), and the results they load."""

    # The HNSW candidate list of this queryset's searches (None: SEARCH["HNSW_EF_SEARCH"]);
    # set by with_ef_search() and carried by every clone.
    _ef_search: int | None = None

    def _clone(self):
        clone = super()._clone()
        clone._ef_search = self._ef_search
        return clone

    def with_ef_search(self, ef_search: int | None) -> ChunkQuerySet:
        """This queryset with its semantic searches scanning an HNSW candidate list of
        ``ef_search`` (None: ``SEARCH["HNSW_EF_SEARCH"]``), set with ``SET LOCAL`` semantics
        (``set_config(..., true)``) inside the search's own transaction, so it never leaks
        to the connection's next statement."""
        clone = self._clone()
        clone._ef_search = ef_search
        return clone

    def _for_results(self):
        return self.select_related("document", "collection").defer(
            "embedding", "search_vector", "document__content"
        )

    def load_hits(self, hits: list[tuple[int, float]], *, score_field: str) -> list:
        """Chunks (with document and collection) for ``(pk, score)`` hits, in hit order.

        Each chunk gets ``score`` and ``<score_field>`` set to its hit's score. A hit deleted
        since it was ranked (a concurrent delete or replace) is left out.
        """
        loaded = (
            self.model.objects.using(self.db)  # the database that ranked them (a replica)
            .filter(pk__in=[pk for pk, _ in hits])
            ._for_results()
            .in_bulk()
        )
        rows = []
        for pk, score in hits:
            row = loaded.get(pk)
            if row is None:
                continue
            row.score = score
            setattr(row, score_field, score)
            rows.append(row)
        return rows

    def results_for(self, items) -> list[SearchResult]:
        """:class:`~django_rag.results.SearchResult` objects for ranked ``items`` (each with
        ``pk``, ``score``, ``semantic_score`` and ``fulltext_score``), in their order, read
        in one statement. An item whose chunk was deleted since it was ranked is left out."""
        if not items:
            return []
        ranked = "SELECT * FROM unnest(%s::bigint[], %s::int[])"
        sql = with_result_columns(self.model, ranked)
        with connections[self.db].cursor() as cursor:
            cursor.execute(sql, [[item.pk for item in items], list(range(len(items)))])
            rows = {row[0]: row for row in cursor.fetchall()}
        results = []
        for item in items:
            row = rows.get(item.pk)
            if row is None:
                continue
            results.append(
                result_from_row(
                    row,
                    score=item.score,
                    semantic_score=item.semantic_score,
                    fulltext_score=item.fulltext_score,
                )
            )
        return results

    # --- hybrid ------------------------------------------------------------------------------

    def hybrid_results(self, vector: Sequence[float], query, *, limit: int, **options) -> list:
        """:meth:`hybrid` as :class:`~django_rag.results.SearchResult` objects, their columns
        read by the statement that scores the candidates (no Chunk objects)."""
        return [
            result_from_row(
                item.row,
                score=item.score,
                semantic_score=item.semantic_score,
                fulltext_score=item.fulltext_score,
            )
            for item in self._hybrid(vector, query, limit=limit, **options)
        ]

    def _hybrid(
        self,
        vector: Sequence[float],
        query,
        *,
        limit: int,
        threshold: float | None = None,
        candidates: int = 4,
        syntax: str = "natural",
        statistics_from: Sequence[int] | None = None,
        **fusion: Any,
    ) -> list:
        """Semantic and BM25 rankings fused, best first (``fusion``: the options of
        :func:`django_rag.fusion.fuse`, the method included).

        The top ``candidates * limit`` chunks of each side (both complete under filters) form
        the candidate set; both scores are then computed for every candidate, so a chunk that
        is good on both sides but top on neither is not lost, and the cost depends on
        ``limit``, not on the corpus. Items get ``pk``, ``semantic_score``, ``fulltext_score``,
        the fused ``score`` and ``row`` (the search result's columns, see
        :func:`.result_rows.with_result_columns`); those with ``score >= threshold`` are kept.
        BM25 reads the statistics of the collections ``statistics_from`` (None: all), as in
        :meth:`fulltext_hits`.

        The full-text ranking runs first (its statements, see :meth:`fulltext_hits`); then one
        statement ranks the semantic side and, for the union of both lists, reads the scores
        each side did not compute and the result columns (:meth:`_hybrid_statement`).
        """
        parsed = self._parsed(query, syntax)
        pool = limit * candidates
        index = bool(parsed.terms) and fulltext_backend(self.db) == "pg_textsearch"
        weights = (
            term_weights(
                parsed.terms, using=self.db, collection_ids=statistics_from, counts=parsed.counts
            )
            if parsed.terms and not index
            else None
        )
        if parsed.terms:  # the cost budget, once for both the ranking and the candidates' BM25
            parsed, weights = limit_terms(
                parsed, weights, using=self.db, collection_ids=statistics_from
            )
            weights = None if index else weights
        fulltext = (
            dict(self.fulltext_hits(parsed, limit=pool, weights=weights))
            if parsed.match is not None
            else {}
        )
        # The BM25 of a candidate the full-text side did not return (0 with no word to score).
        if index:
            sql, params = score_sql(parsed.words)
            score = (f"0.0 - ({sql})", params)  # the index's statistics, negated back
        elif weights is not None:
            score = bm25_sql(weights, weights.boosts(parsed))
        else:
            score = ("0.0", [])
        literal = vector_literal(vector)  # the ranking's and the scoring's, written once
        rows = self.without_excluded(parsed)._nearest(
            literal,
            pool,
            wrap=self._hybrid_statement(literal, list(fulltext), score),
            ranked=lambda rows: sum(1 for row in rows if row[-1]),
        )
        if not rows:
            return []
        # In primary-key order, as the single scoring query used to return them (ties in
        # fusion keep this order).
        scored = [
            SimpleNamespace(
                pk=row[0],
                semantic_score=1.0 - float(row[1]),
                fulltext_score=fulltext[row[0]] if row[0] in fulltext else float(row[-2]),
                row=row,
            )
            for row in sorted(rows, key=lambda row: row[0])
        ]
        fused = fuse(scored, pool=pool, readable=True, **fusion)
        if threshold is not None:
            fused = [item for item in fused if item.score >= threshold]
        return fused[:limit]

    def _hybrid_statement(self, literal: str, fulltext: list[int], score) -> Wrap:
        """The hybrid search's scoring statement around the semantic ranking (a ``wrap`` of
        :meth:`_nearest`; ``literal``: the query vector's text): the union of the ranked chunks
        and the ``fulltext`` ones (their pks), each with its cosine distance (the ranking's own
        where it ranked it), its BM25 by ``score`` (SQL and params) unless the full-text side
        returned it (NULL then), and whether the semantic ranking returned it, joined to the
        result columns."""
        meta = self.model._meta
        table = f'"{meta.db_table}"'
        pk = f'{table}."{meta.pk.column}"'
        embedding = f'{table}."{meta.get_field("embedding").column}"'
        score_sql_, score_params = score

        def wrap(sql: str, params: list) -> tuple[str, list]:
            scored = (
                f"WITH ranked (pk, distance) AS MATERIALIZED ({sql}), "
                "fulltext (pk) AS (SELECT unnest(%s::bigint[])), "
                "candidates (pk) AS (SELECT pk FROM ranked UNION SELECT pk FROM fulltext) "
                f"SELECT {pk}, coalesce(ranked.distance, {embedding} <=> %s::vector), "
                "CASE WHEN candidates.pk IN (SELECT pk FROM fulltext) THEN NULL "
                f"ELSE {score_sql_} END, ranked.pk IS NOT NULL "
                f"FROM candidates JOIN {table} ON {pk} = candidates.pk "
                "LEFT JOIN ranked ON ranked.pk = candidates.pk"
            )
            return (
                with_result_columns(self.model, scored, extra=("fulltext_score", "ranked")),
                [*params, fulltext, literal, *score_params],
            )

        return wrap

    def hybrid(self, vector: Sequence[float], query, *, limit: int, **options) -> list:
        """Semantic and BM25 rankings fused, best first (options: see :meth:`hybrid_results`).

        Chunks get ``semantic_score``, ``fulltext_score`` and the fused ``score``."""
        fused = self._hybrid(vector, query, limit=limit, **options)
        chunks = self.load_hits([(item.pk, item.score) for item in fused], score_field="score")
        by_pk = {item.pk: item for item in fused}
        for chunk in chunks:
            chunk.semantic_score = by_pk[chunk.pk].semantic_score
            chunk.fulltext_score = by_pk[chunk.pk].fulltext_score
        return chunks
