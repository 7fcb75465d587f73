"""Full-text search in SQL: BM25 over the chunks' search vectors (the SQL backend, in rounds
bounded by a candidate budget) or through the pg_textsearch index."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Self

from django.db.models import BooleanField, F, FloatField, Value
from django.db.models.expressions import RawSQL

from .bm25 import bm25_sql, limit_terms, term_weights, threshold_query
from .fulltext_query import parse_query, quote_terms
from .textsearch import fulltext_backend, score_sql

# Postings (chunks per term, summed) the first full-text round may read; see fulltext().
FULLTEXT_CANDIDATE_BUDGET = 2000
# How far the pg_textsearch backend reads past `limit` rows to make up for rows its scan
# repeated before it scores every match instead (see _index_hits).
INDEX_SCAN_MAX_WIDENING = 16


class FulltextSearch:
    """The full-text search methods of :class:`~django_rag.models.managers.ChunkQuerySet`."""

    def matching(self, tsquery: str) -> Self:
        """Chunks whose search vector matches ``tsquery`` (found through the GIN index)."""
        return self.filter(
            RawSQL(
                "django_rag_chunk.search_vector @@ %s::tsquery",
                [tsquery],
                output_field=BooleanField(),
            )
        )

    def without_excluded(self, parsed) -> Self:
        if not parsed.exclude:
            return self
        return self.filter(
            RawSQL(
                "NOT coalesce(django_rag_chunk.search_vector @@ %s::tsquery, false)",
                [parsed.exclude],
                output_field=BooleanField(),
            )
        )

    def with_bm25(self, weights, boosts=()) -> Self:
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
        each term's largest tf and smallest chunk length, see ``TermWeights.upper_bound``).
        Otherwise, when that round found ``limit`` chunks, its last score is one the results
        must reach, and one more round scores only the chunks holding words whose bounds add
        up to it (``bm25.threshold_query``, answered by GIN); when it found fewer, the next
        terms are added.

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
            parsed.terms, using=self.db, collection_ids=statistics_from, counts=parsed.counts
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
            if len(hits) == limit:
                # The last score is one the results must reach: only chunks holding words
                # whose bounds add up to it (less the phrase boosts, counted whole) can, and
                # GIN finds them without reading the others. One more round is exact.
                narrow = threshold_query(weights, hits[-1][1] - sum(w for _, w in boosts))
                if narrow is not None:
                    return list(
                        scored.matching(narrow)
                        .order_by("-fulltext_score", "pk")
                        .values_list("pk", "fulltext_score")[:limit]
                    )
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

    def with_index_bm25(self, parsed) -> Self:
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
