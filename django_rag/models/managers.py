"""Query methods for chunks: the search modes live here."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from types import SimpleNamespace

from django.core.exceptions import EmptyResultSet
from django.db import connections, models, transaction
from django.db.models import BooleanField, F, FloatField, Value
from django.db.models.expressions import RawSQL
from pgvector.django import CosineDistance

from ..conf import search_setting
from ..fusion import fuse
from ..results import SearchResult
from .fulltext import bm25_sql, limit_terms, parse_query, quote_terms, term_weights
from .textsearch import fulltext_backend, score_sql

try:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3
except ImportError:  # pragma: no cover - psycopg not installed: no PostgreSQL backend either
    is_psycopg3 = False

_pgvector_versions: dict[str, tuple[int, ...]] = {}

# Postings (chunks per term, summed) the first full-text round may read; see fulltext().
FULLTEXT_CANDIDATE_BUDGET = 2000
# How far the pg_textsearch backend reads past `limit` rows to make up for rows its scan
# repeated before it scores every match instead (see _index_hits).
INDEX_SCAN_MAX_WIDENING = 16


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


def _json(value):
    return json.loads(value) if isinstance(value, str | bytes) else (value or {})


def _with_result_columns(model, ranked_sql: str) -> str:
    """``ranked_sql`` (rows ``pk, distance``) joined to the chunk, document and collection
    columns a search result needs, in the same order."""
    chunk = model._meta
    document = chunk.get_field("document").related_model._meta
    collection = chunk.get_field("collection").related_model._meta

    def column(meta, alias, name):
        return f'{alias}."{meta.get_field(name).column}"'

    fields = [
        column(chunk, "c", "text"),
        column(chunk, "c", "document"),
        column(chunk, "c", "chunk_index"),
        column(collection, "col", "name"),
        column(document, "d", "source_id"),
        column(document, "d", "title"),
        column(document, "d", "original_filename"),
        column(chunk, "c", "page_start"),
        column(chunk, "c", "page_end"),
        column(chunk, "c", "start_char"),
        column(chunk, "c", "end_char"),
        column(document, "d", "metadata"),
        column(chunk, "c", "metadata"),
    ]
    return (
        f"SELECT hits.pk, hits.distance, {', '.join(fields)} "
        f"FROM ({ranked_sql}) AS hits (pk, distance) "
        f'JOIN "{chunk.db_table}" c ON c."{chunk.pk.column}" = hits.pk '
        f'JOIN "{document.db_table}" d ON d."{document.pk.column}" = '
        f"{column(chunk, 'c', 'document')} "
        f'JOIN "{collection.db_table}" col ON col."{collection.pk.column}" = '
        f"{column(chunk, 'c', 'collection')} "
        "ORDER BY hits.distance, hits.pk"
    )


def _result(row, **scores) -> SearchResult:
    """A :class:`SearchResult` from a row of :func:`_with_result_columns` (its second column,
    the ranking's own value, is not used) and the scores to give it."""
    (pk, _, text, document_id, chunk_index, collection, source_id, title, filename,
     page_start, page_end, start_char, end_char, document_metadata,
     chunk_metadata) = row  # fmt: skip
    return SearchResult(
        chunk_id=pk,
        text=text,
        document_id=document_id,
        chunk_index=chunk_index,
        collection=collection,
        source_id=source_id,
        title=title,
        filename=filename,
        page_start=page_start,
        page_end=page_end,
        start_char=start_char,
        end_char=end_char,
        metadata={**_json(document_metadata), **_json(chunk_metadata)},
        **scores,
    )


class ChunkQuerySet(models.QuerySet):
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
        sql = _with_result_columns(self.model, ranked)
        with connections[self.db].cursor() as cursor:
            cursor.execute(sql, [[item.pk for item in items], list(range(len(items)))])
            rows = {row[0]: row for row in cursor.fetchall()}
        results = []
        for item in items:
            row = rows.get(item.pk)
            if row is None:
                continue
            results.append(
                _result(
                    row,
                    score=item.score,
                    semantic_score=item.semantic_score,
                    fulltext_score=item.fulltext_score,
                )
            )
        return results

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
        for row in self._nearest(vector, limit, columns=True):
            score = 1.0 - float(row[1])  # row[1]: the cosine distance
            if threshold is None or score >= threshold:
                results.append(_result(row, score=score, semantic_score=score))
        return results

    def _nearest(self, vector: Sequence[float], limit: int, *, columns: bool = False) -> list:
        """Rows ``(pk, cosine distance[, result columns])`` of the ``limit`` nearest chunks,
        nearest first; complete under any filter (see :meth:`semantic_hits`)."""
        base = self.annotate(distance=CosineDistance("embedding", vector))
        if self.query.where:
            cap = search_setting("EXACT_SEARCH_MAX_ROWS")
            if self._count_upto(cap + 1) <= cap:
                rows = self._exact(base, limit, columns=columns)
            else:
                rows = self._approximate(base, limit, filtered=True, columns=columns)
        else:
            rows = self._approximate(base, limit, filtered=False, columns=columns)
        if len(rows) < limit and self._count_upto(limit) > len(rows):
            rows = self._exact(base, limit, columns=columns)
        return rows

    def _count_upto(self, cap: int) -> int:
        return self.order_by().values("pk")[:cap].count()

    def _exact(self, base, limit: int, *, columns: bool = False) -> list:
        # Ordering by an expression the HNSW index cannot serve forces an exact scan over the
        # rows the filter selects (found through the filter's own B-tree index).
        ranked = base.order_by(F("distance") + Value(0.0), "pk").values_list("pk", "distance")
        return self._fetch(ranked[:limit], columns=columns)

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

    def _approximate(self, base, limit: int, *, filtered: bool, columns: bool = False) -> list:
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
        ranked = base.order_by("distance").values_list("pk", "distance")[:limit]
        rows = self._fetch(ranked, columns=columns, settings=settings)
        # relaxed_order may return neighbours slightly out of order.
        return sorted(rows, key=lambda row: (row[1], row[0]))

    def _fetch(self, ranked, *, columns: bool, settings=()) -> list:
        """Run ``ranked`` (a ``values_list("pk", "distance")`` queryset) after setting the
        transaction-local ``settings``, in one round trip where the driver allows several
        statements in one call (client-side binding, Django's default); with ``columns``, the
        fields a search result needs are joined in the same statement."""
        connection = connections[self.db]
        try:
            sql, params = ranked.query.get_compiler(using=self.db).as_sql()
        except EmptyResultSet:  # a filter that can match nothing (an empty IN list)
            return []
        if columns:
            sql = _with_result_columns(self.model, sql)
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

    # --- full-text ---------------------------------------------------------------------------

    def matching(self, tsquery: str) -> ChunkQuerySet:
        """Chunks whose search vector matches ``tsquery`` (found through the GIN index)."""
        return self.filter(
            RawSQL(
                "django_rag_chunk.search_vector @@ %s::tsquery",
                [tsquery],
                output_field=BooleanField(),
            )
        )

    def without_excluded(self, parsed) -> ChunkQuerySet:
        if not parsed.exclude:
            return self
        return self.filter(
            RawSQL(
                "NOT coalesce(django_rag_chunk.search_vector @@ %s::tsquery, false)",
                [parsed.exclude],
                output_field=BooleanField(),
            )
        )

    def with_bm25(self, weights, boosts=()) -> ChunkQuerySet:
        """Annotate ``fulltext_score``: BM25 of each chunk for the weighted terms (0 if none),
        plus the phrase ``boosts`` it matches."""
        sql, params = bm25_sql(weights, boosts)
        return self.annotate(fulltext_score=RawSQL(sql, params, output_field=FloatField()))

    def _parsed(self, query, syntax: str):
        return parse_query(query, syntax=syntax, using=self.db) if isinstance(query, str) else query

    def fulltext(
        self,
        query,
        *,
        limit: int,
        threshold: float | None = None,
        syntax: str = "natural",
        statistics_from: Sequence[int] | None = None,
    ) -> list:
        """The ``limit`` chunks of this queryset ranked by BM25 for ``query``, best first.

        ``query`` is a string (read with ``syntax``, see ``models.fulltext.parse_query``) or an
        already parsed query. Chunks get ``score`` = ``fulltext_score`` (BM25); only those with
        ``score >= threshold`` are kept. See :meth:`fulltext_hits`.
        """
        hits = self.fulltext_hits(
            query, limit=limit, syntax=syntax, statistics_from=statistics_from
        )
        if threshold is not None:
            hits = [hit for hit in hits if hit[1] >= threshold]
        return self.load_hits(hits, score_field="fulltext_score")

    def fulltext_results(self, query, *, limit: int, threshold: float | None = None, **options):
        """:meth:`fulltext` as :class:`~django_rag.results.SearchResult` objects, their columns
        read in one statement (no Chunk objects)."""
        hits = self.fulltext_hits(query, limit=limit, **options)
        return self.results_for(
            [
                SimpleNamespace(pk=pk, score=score, semantic_score=None, fulltext_score=score)
                for pk, score in hits
                if threshold is None or score >= threshold
            ]
        )

    def fulltext_hits(
        self,
        query,
        *,
        limit: int,
        weights=None,
        syntax: str = "natural",
        statistics_from: Sequence[int] | None = None,
    ) -> list[tuple[int, float]]:
        """``(pk, BM25)`` of the ``limit`` best full-text matches.

        BM25 reads the statistics of the collections ``statistics_from`` (their ids; None: the
        whole database). It does not filter: filter the queryset for that (a search scoped to
        collections does both).

        Filters are exact: candidates come from the GIN index, not from an approximate scan.
        The ranking is exact but does not score every chunk that shares a common word with the
        query (MaxScore): candidates first come from the query's rarest terms, about
        ``FULLTEXT_CANDIDATE_BUDGET`` postings' worth; the result stands when its last score
        beats the most a chunk containing only the remaining terms could score (bounded with
        each term's largest tf and smallest chunk length, see ``TermWeights.upper_bound``), and
        otherwise the next terms are added.

        Where ``SEARCH["FULLTEXT_BACKEND"]`` resolves to ``"pg_textsearch"`` the pg_textsearch
        BM25 index ranks instead (:meth:`_index_hits`; its statistics are the whole table's,
        so ``weights`` and ``statistics_from`` do not apply).
        """
        parsed = self._parsed(query, syntax)
        if parsed.match is None:
            return []
        if fulltext_backend(self.db) == "pg_textsearch":
            parsed, _ = limit_terms(parsed, using=self.db)
            return self._index_hits(parsed, limit)
        weights = weights or term_weights(
            parsed.terms, using=self.db, collection_ids=statistics_from
        )
        parsed, weights = limit_terms(parsed, weights)
        boosts = weights.boosts(parsed)
        scored = self.without_excluded(parsed).with_bm25(weights, boosts)
        if parsed.phrases:  # already selective, and they match as a whole
            return list(
                scored.matching(parsed.match)
                .order_by("-fulltext_score", "pk")
                .values_list("pk", "fulltext_score")[:limit]
            )
        # Candidates come from a prefix of the terms, rarest first.
        order = [
            weights.terms[i]
            for i in sorted(range(len(weights.terms)), key=lambda i: weights.frequencies[i])
        ]
        frequency = dict(zip(weights.terms, weights.frequencies, strict=True))
        budget = FULLTEXT_CANDIDATE_BUDGET

        def within(budget: int, at_least: int) -> int:
            """The longest prefix within ``budget`` postings (at least ``at_least`` terms)."""
            n, postings = 0, 0
            while n < len(order) and (n < at_least or postings + frequency[order[n]] <= budget):
                postings += frequency[order[n]]
                n += 1
            return n

        n = within(budget, 1)
        while True:
            chosen, rest = order[:n], order[n:]
            hits = list(
                scored.matching(quote_terms(chosen))
                .order_by("-fulltext_score", "pk")
                .values_list("pk", "fulltext_score")[:limit]
            )
            # Strictly above: a chunk of the remaining terms scoring as much could tie and
            # come first by pk.
            if not rest or (len(hits) == limit and hits[-1][1] > weights.upper_bound(rest, boosts)):
                return hits
            # Widen: 8 times the postings, or, when fewer, just the terms after which the
            # remaining ones cannot reach this round's last score (the next round's last score
            # is at least as high, so that round is the last).
            budget *= 8
            wider = within(budget, n + 1)
            if len(hits) == limit:
                needed = n + 1
                while needed < len(order) and hits[-1][1] <= weights.upper_bound(
                    order[needed:], boosts
                ):
                    needed += 1
                wider = min(wider, needed)
            n = wider

    def with_index_bm25(self, parsed) -> ChunkQuerySet:
        """Annotate ``bm25_distance``: the pg_textsearch index's negated BM25 of each chunk for
        ``parsed`` (lower is better; 0 for a chunk holding none of its words)."""
        sql, params = score_sql(parsed.words)
        return self.annotate(bm25_distance=RawSQL(sql, params, output_field=FloatField()))

    def _index_hits(self, parsed, limit: int) -> list[tuple[int, float]]:
        """:meth:`fulltext_hits` on the pg_textsearch index (``FULLTEXT_BACKEND``).

        The index ranks (``ORDER BY text <@> query``, ties by pk); the queryset's filters, the
        required phrases and the excluded words of web-search syntax are conditions the scan
        applies to the rows it returns, and it keeps scanning until ``limit`` rows passed them.
        Should a scan still come back short while more chunks match, the matching chunks are
        scored one by one with the same index statistics (an exact scan), so the result always
        has min(limit, matching chunks) rows, as on the SQL backend. Natural-syntax phrase
        boosts are not applied here: a quoted phrase counts as its words."""
        if not parsed.words:
            return []
        candidates = self.without_excluded(parsed)
        if parsed.phrases:
            candidates = candidates.matching(parsed.match)
        ranked = candidates.with_index_bm25(parsed).order_by("bm25_distance", "pk")
        # pg_textsearch 1.0.0 was seen to return a row twice in a scan over many equal scores
        # (6% of SciFact's queries at 100k chunks, where the padding repeats texts): repeats
        # are dropped and the scan read further, rather than scoring every match (over 1 s).
        fetch = limit
        while True:
            hits, matched = self._index_rows(ranked, fetch)
            hits = hits[:limit]
            # Done when full, when the scan ran out of matches, or after reading far enough.
            if len(hits) >= limit or matched < fetch or fetch >= INDEX_SCAN_MAX_WIDENING * limit:
                break
            fetch *= 4
        if len(hits) < limit:
            matching = candidates.matching(
                parsed.match if parsed.phrases else quote_terms(parsed.terms)
            )
            if matching._count_upto(limit) > len(hits):
                # The exact fallback: an ordering the index cannot serve.
                exact = matching.with_index_bm25(parsed).order_by(
                    F("bm25_distance") + Value(0.0), "pk"
                )
                hits, _ = self._index_rows(exact, limit)
        return hits

    @staticmethod
    def _index_rows(ranked, limit: int) -> tuple[list[tuple[int, float]], int]:
        """The first ``limit`` rows of ``ranked`` as ``(pk, BM25)`` with repeats dropped, and
        how many matching rows (repeats included) were read.

        A filtered scan that ran out of matches goes on with rows holding none of the words
        (distance 0, after every match): they are not results."""
        rows: dict[int, float] = {}
        matched = 0
        for pk, distance in ranked.values_list("pk", "bm25_distance")[:limit]:
            if distance < 0:
                matched += 1
                rows.setdefault(pk, -float(distance))
        return list(rows.items()), matched

    # --- hybrid ------------------------------------------------------------------------------

    def hybrid_results(self, vector: Sequence[float], query, *, limit: int, **options) -> list:
        """:meth:`hybrid` as :class:`~django_rag.results.SearchResult` objects, their columns
        read in one statement (no Chunk objects)."""
        return self.results_for(self._hybrid(vector, query, limit=limit, **options))

    def _hybrid(
        self,
        vector: Sequence[float],
        query,
        *,
        limit: int,
        threshold: float | None = None,
        fusion: str = "rrf",
        rrf_k: int = 60,
        semantic_weight: float = 0.5,
        fulltext_weight: float = 0.5,
        candidates: int = 4,
        syntax: str = "natural",
        statistics_from: Sequence[int] | None = None,
    ) -> list:
        """Semantic and BM25 rankings fused, best first.

        The top ``candidates * limit`` chunks of each side (both complete under filters) form
        the candidate set; both scores are then computed for every candidate, so a chunk that
        is good on both sides but top on neither is not lost, and the cost depends on
        ``limit``, not on the corpus. Chunks get ``semantic_score``, ``fulltext_score`` and the
        fused ``score``; those with ``score >= threshold`` are kept. BM25 reads the statistics
        of the collections ``statistics_from`` (None: all), as in :meth:`fulltext_hits`.
        """
        parsed = self._parsed(query, syntax)
        pool = limit * candidates
        index = bool(parsed.terms) and fulltext_backend(self.db) == "pg_textsearch"
        weights = (
            term_weights(parsed.terms, using=self.db, collection_ids=statistics_from)
            if parsed.terms and not index
            else None
        )
        if parsed.terms:  # the cost budget, once for both the ranking and the candidates' BM25
            parsed, weights = limit_terms(
                parsed, weights, using=self.db, collection_ids=statistics_from
            )
            weights = None if index else weights
        semantic = dict(self.without_excluded(parsed).semantic_hits(vector, limit=pool))
        fulltext = (
            dict(self.fulltext_hits(parsed, limit=pool, weights=weights))
            if parsed.match is not None
            else {}
        )
        if not semantic and not fulltext:
            return []
        if not index and weights is None:  # no word to score: every BM25 is 0
            fulltext = dict.fromkeys(semantic, 0.0)
        # Each side's ranking already computed its score for its own candidates (the same SQL
        # expression, so the same value): only the missing scores are computed, the costly
        # BM25 only for chunks the full-text side did not return.
        missing = sorted(pk for pk in semantic.keys() | fulltext.keys() if pk not in semantic
                         or pk not in fulltext)  # fmt: skip
        if missing:
            rows = (
                self.model.objects.using(self.db)
                .filter(pk__in=missing)
                .annotate(distance=CosineDistance("embedding", vector))
            )
            if index or weights is not None:
                if index:
                    # The index's statistics for each candidate (its score, negated back).
                    sql, params = score_sql(parsed.words)
                    sql = f"0.0 - ({sql})"
                else:
                    sql, params = bm25_sql(weights, weights.boosts(parsed))
                if fulltext:
                    pk_column = f'{self.model._meta.db_table}."{self.model._meta.pk.column}"'
                    sql = f"CASE WHEN {pk_column} = ANY(%s) THEN NULL ELSE {sql} END"
                    params = [list(fulltext), *params]
                score = RawSQL(sql, params, output_field=FloatField())
            else:
                score = Value(None, output_field=FloatField())
            for pk, distance, bm25 in rows.annotate(fulltext_score=score).values_list(
                "pk", "distance", "fulltext_score"
            ):
                semantic.setdefault(pk, 1.0 - float(distance))
                if bm25 is not None:
                    fulltext.setdefault(pk, bm25)
        # In primary-key order, as the single scoring query used to return them (ties in
        # fusion keep this order).
        scored = [
            SimpleNamespace(pk=pk, semantic_score=semantic[pk], fulltext_score=fulltext[pk])
            for pk in sorted(semantic.keys() & fulltext.keys())
        ]
        fused = fuse(
            scored,
            fusion=fusion,
            rrf_k=rrf_k,
            semantic_weight=semantic_weight,
            fulltext_weight=fulltext_weight,
            pool=pool,
            readable=True,
        )
        if threshold is not None:
            fused = [item for item in fused if item.score >= threshold]
        return fused[:limit]

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
