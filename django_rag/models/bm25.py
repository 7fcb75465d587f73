"""BM25 in SQL: reading the statistics a query needs (a collection's, or the sum over the
collections a search is scoped to, pending deltas included), the terms' weights, the cap on a
query's terms, and the scoring expression.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from django.db import connections

from ..conf import bm25_k3, max_query_terms, search_setting
from .fulltext_query import FulltextQuery, quote_terms


def _scope(collection_ids: Sequence[int] | None) -> tuple[str, list]:
    """SQL condition (and params) selecting the rows of ``collection_ids`` (None: all)."""
    if collection_ids is None:
        return "", []
    return " AND collection_id = ANY(%s)", [[int(pk) for pk in collection_ids]]


def corpus_statistics(
    using: str = "default", collection_ids: Sequence[int] | None = None
) -> tuple[int, int]:
    """(chunks indexed for full-text search, their total length), pending deltas included,
    in the collections ``collection_ids`` (None: the whole database)."""
    where, params = _scope(collection_ids)
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(chunk_count), 0), coalesce(sum(total_length), 0) FROM ("
            f"SELECT chunk_count, total_length FROM django_rag_corpus WHERE true{where} "
            "UNION ALL SELECT chunk_count, total_length FROM django_rag_corpus_delta "
            f"WHERE true{where}) s",
            params * 2,
        )
        chunks, length = cursor.fetchone()
    return int(chunks), int(length)


def term_statistics(
    terms: list[str], using: str = "default", collection_ids: Sequence[int] | None = None
) -> dict[str, tuple[int, int | None, int | None]]:
    """``(document frequency, max tf, min length)`` of each of ``terms`` (terms in none are
    left out), in the collections ``collection_ids`` (None: the whole database): the chunks
    containing the term, the most times one of them holds it and the shortest of them (as
    bounds: deletes do not tighten them; None where unknown)."""
    if not terms:
        return {}
    where, params = _scope(collection_ids)
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT term, sum(n), max(max_tf), min(min_length) FROM ("
            "SELECT term, document_frequency AS n, max_tf, min_length FROM django_rag_term "
            f"WHERE term = ANY(%s){where} "
            "UNION ALL SELECT term, delta, max_tf, min_length FROM django_rag_term_delta "
            f"WHERE term = ANY(%s){where}"
            ") s GROUP BY term",
            [list(terms), *params, list(terms), *params],
        )
        return {
            term: (int(n), None if tf is None else int(tf), None if length is None else int(length))
            for term, n, tf, length in cursor.fetchall()
        }


def _statistics(
    terms: list[str], using: str = "default", collection_ids: Sequence[int] | None = None
) -> tuple[int, int, dict[str, tuple[int, int | None, int | None]]]:
    """:func:`corpus_statistics` and :func:`term_statistics` in one round trip (and one
    snapshot): ``(chunks, total length, term statistics)``."""
    where, params = _scope(collection_ids)
    with connections[using].cursor() as cursor:
        cursor.execute(
            "WITH c AS (SELECT coalesce(sum(chunk_count), 0), coalesce(sum(total_length), 0) "
            f"FROM (SELECT chunk_count, total_length FROM django_rag_corpus WHERE true{where} "
            "UNION ALL SELECT chunk_count, total_length FROM django_rag_corpus_delta "
            f"WHERE true{where}) s), "
            "t AS (SELECT term, sum(n), max(max_tf), min(min_length) FROM ("
            "SELECT term, document_frequency AS n, max_tf, min_length FROM django_rag_term "
            f"WHERE term = ANY(%s){where} "
            "UNION ALL SELECT term, delta, max_tf, min_length FROM django_rag_term_delta "
            f"WHERE term = ANY(%s){where}"
            ") s GROUP BY term) "
            "SELECT * FROM c LEFT JOIN t ON true",
            [*params, *params, list(terms), *params, list(terms), *params],
        )
        rows = cursor.fetchall()
    stored = {
        term: (int(n), None if tf is None else int(tf), None if length is None else int(length))
        for _, _, term, n, tf, length in rows
        if term is not None
    }
    return int(rows[0][0]), int(rows[0][1]), stored


def term_frequencies(
    terms: list[str], using: str = "default", collection_ids: Sequence[int] | None = None
) -> dict[str, int]:
    """How many chunks contain each of ``terms`` (terms in none are left out), in the
    collections ``collection_ids`` (None: the whole database)."""
    return {term: n for term, (n, _, _) in term_statistics(terms, using, collection_ids).items()}


def query_term_weight(count: int, k3: float | None) -> float:
    """How much a word ``count`` times in a query weighs against one there once: BM25's k3
    rule ``(k3 + 1) count / (k3 + count)``. ``k3`` 0 gives 1 whatever the count (each word
    counts once); a larger ``k3`` lets repeats weigh more, up to ``k3 + 1`` times; None gives
    the raw count (as Lucene and bm25s score a query). The one place the rule lives: the SQL
    backend and the memory store both weigh with it."""
    count = max(int(count), 1)
    if k3 is None:
        return float(count)
    return (k3 + 1) * count / (k3 + count)


def query_term_weights(terms: Sequence[str], counts: Mapping[str, int] | None) -> list[float]:
    """:func:`query_term_weight` of each of ``terms`` with ``SEARCH["BM25_K3"]`` (a term
    missing from ``counts`` counts once)."""
    k3 = bm25_k3()
    counts = counts or {}
    return [query_term_weight(counts.get(term, 1), k3) for term in terms]


@dataclass
class TermWeights:
    """BM25 statistics of a query's terms, from the trigger-maintained tables."""

    terms: list[str]
    frequencies: list[int]  # chunks containing each term
    idf: list[float]
    average_length: float
    # Bounds of each term's tf part (None where unknown), see upper_bound.
    max_tf: list[int | None] = field(default_factory=list)
    min_length: list[int | None] = field(default_factory=list)
    # Each term's weight for its count in the query (query_term_weight; empty: all 1).
    query_weights: list[float] = field(default_factory=list)

    def scoring(self) -> list[float]:
        """What each term's tf part is multiplied by: its idf times its query weight."""
        if len(self.query_weights) != len(self.idf):
            return list(self.idf)
        return [idf * q for idf, q in zip(self.idf, self.query_weights, strict=True)]

    def upper_bound(self, terms: list[str], boosts=()) -> float:
        """The most a chunk can score from ``terms`` alone, plus every phrase boost (counted
        whole: the bound stays safe).

        BM25's tf part ``tf (k1 + 1) / (tf + k1 (1 - b + b length / avgdl))`` grows with tf and
        shrinks with the length, so with the largest tf and the smallest length of the chunks
        containing a term (stored per term and collection) it bounds every chunk's; without
        them, the part's limit, k1 + 1. A hair is added against rounding: the search compares
        scores PostgreSQL computed with this."""
        k1 = float(search_setting("BM25_K1"))
        b = float(search_setting("BM25_B"))
        index = {t: i for i, t in enumerate(self.terms)}
        scoring = self.scoring()
        total = 0.0
        for term in terms:
            i = index[term]
            tf = self.max_tf[i] if i < len(self.max_tf) else None
            length = self.min_length[i] if i < len(self.min_length) else None
            if tf is None or length is None or k1 < 0 or not 0 <= b <= 1:
                part = k1 + 1
            else:
                tf = max(tf, 1)
                norm = k1 * (1 - b + b * max(length, 0) / self.average_length)
                part = min(tf * (k1 + 1) / (tf + norm), k1 + 1) if tf + norm > 0 else k1 + 1
            total += scoring[i] * part
        total += sum(w for _, w in boosts)
        return total * (1 + 1e-9) + 1e-12

    def boosts(self, parsed: FulltextQuery) -> list[tuple[str, float]]:
        """(phrase tsquery, weight) of a natural query's phrases: a chunk holding the phrase
        scores as if the phrase were one more word, as rare as its words together (their idf,
        not weighed by how often the query repeats them: the words' own scores are)."""
        weight = dict(zip(self.terms, self.idf, strict=True))
        return [(q, sum(weight.get(t, 0.0) for t in lexemes)) for q, lexemes in parsed.boosts]


def term_weights(
    terms: list[str],
    using: str = "default",
    collection_ids: Sequence[int] | None = None,
    *,
    counts: Mapping[str, int] | None = None,
) -> TermWeights:
    """Document frequencies and BM25 inverse document frequencies of ``terms``, from the
    statistics of the collections ``collection_ids`` (None: the whole database), and their
    query weights for ``counts`` (how many times the query holds each term, see
    :func:`query_term_weight`; None: each once)."""
    total, total_length, stored = _statistics(terms, using, collection_ids)
    average_length = (total_length / total) if total else 1.0
    frequencies = [max(0, stored[term][0]) if term in stored else 0 for term in terms]
    # Lucene's BM25 idf: never negative, even for a term in most chunks.
    idf = [math.log(1 + (total - df + 0.5) / (df + 0.5)) for df in frequencies]
    return TermWeights(
        terms,
        frequencies,
        idf,
        max(average_length, 1.0),
        max_tf=[stored[term][1] if term in stored else None for term in terms],
        min_length=[stored[term][2] if term in stored else None for term in terms],
        query_weights=query_term_weights(terms, counts),
    )


def limit_terms(
    parsed: FulltextQuery,
    weights: TermWeights | None = None,
    *,
    using: str = "default",
    collection_ids: Sequence[int] | None = None,
) -> tuple[FulltextQuery, TermWeights | None]:
    """``parsed`` and its ``weights`` within ``SEARCH["MAX_QUERY_TERMS"]``: the cost budget of
    one full-text ranking.

    A query's cost grows with its distinct words (one posting list each, and every candidate
    chunk is scored against all of them): a 10,000-character query of 1,400 distinct words
    scored most of a 100k-chunk table. A query with more distinct words than the cap keeps the
    most selective ones, those in the fewest chunks (the highest idf: the ones BM25 weighs
    most), ties in query order; words in no chunk go last (they match and score nothing).
    How often the query repeats a word does not change which words are kept (the cap bounds
    posting lists, which repeats do not lengthen); the kept words keep their query weights.
    Phrase boosts are kept when all their words are; required phrases and excluded words of
    web-search syntax still apply whole. A query within the cap comes back as it was, so
    normal queries rank exactly as without a cap. ``weights`` (of ``parsed.terms``) are read
    from the statistics when not given, and returned for the kept terms."""
    cap = max_query_terms()
    if cap is None or len(parsed.terms) <= cap:
        return parsed, weights
    if weights is None or weights.terms != parsed.terms:
        weights = term_weights(
            parsed.terms, using=using, collection_ids=collection_ids, counts=parsed.counts
        )
    index = {term: i for i, term in enumerate(weights.terms)}
    position = {term: n for n, term in enumerate(parsed.word_of)}

    def selectivity(term: str):
        df = weights.frequencies[index[term]]
        return (df == 0, df, position.get(term, len(position)), term)

    kept_set = set(sorted(parsed.terms, key=selectivity)[:cap])
    kept = [term for term in parsed.terms if term in kept_set]
    rows = [index[term] for term in kept]

    def pick(values: list) -> list:
        return [values[i] for i in rows] if len(values) == len(weights.terms) else []

    capped_weights = TermWeights(
        kept,
        pick(weights.frequencies),
        pick(weights.idf),
        weights.average_length,
        max_tf=pick(weights.max_tf),
        min_length=pick(weights.min_length),
        query_weights=pick(weights.query_weights),
    )
    word_of = {term: word for term, word in parsed.word_of.items() if term in kept_set}
    capped = replace(
        parsed,
        match=parsed.match if parsed.phrases else quote_terms(kept),
        terms=kept,
        boosts=[boost for boost in parsed.boosts if set(boost[1]) <= kept_set],
        words=list(dict.fromkeys(word_of.values())) if parsed.word_of else parsed.words,
        word_of=word_of,
        dropped_terms=len(parsed.terms) - len(kept),
        counts={term: n for term, n in parsed.counts.items() if term in kept_set},
    )
    return capped, capped_weights


# Nodes a threshold query (see threshold_query) may have: GIN evaluates the whole tree for each
# chunk holding one of its words, so its size is a cost of every such chunk.
THRESHOLD_QUERY_NODES = 300


def threshold_query(weights: TermWeights, need: float) -> str | None:
    """A tsquery matching every chunk whose words of the query could make it score ``need``
    (a superset: it may match more, never fewer), or None when every chunk holding one of
    the words may (then the plain any-word query is as narrow).

    A chunk's BM25 is at most the sum of the upper bounds (:meth:`TermWeights.upper_bound`)
    of the query's words it holds, so with ``need`` the score the results must reach (the
    ``limit``-th best score found so far), only chunks holding a set of words whose bounds add
    up to ``need`` can still enter the results. That condition is written as a boolean query
    over the words, largest bound first: the chunk holds the first word and the rest make up
    what is left, or it does without the first word and the rest make up all of it. GIN then
    answers it from the posting lists, without reading the chunks that fail it. The tree
    grows quickly with many words of similar weight; past ``THRESHOLD_QUERY_NODES`` the words
    with the smallest bounds are merged into one "any of them" word bounded by their sum
    (still a superset), as many as needed to fit, and the chunk must also hold one of the
    words MaxScore cannot skip."""
    # Every word, those the statistics count in no chunk too (their bound is large and their
    # posting list empty: they cost nothing, and the query stays a superset whatever the
    # statistics say).
    bounds = sorted(
        ((quote_terms([t]), weights.upper_bound([t])) for t in weights.terms),
        key=lambda item: -item[1],
    )
    if need <= 0 or not bounds:
        return None
    # MaxScore's rule, which the exact tree implies and a merged one may not: a chunk holding
    # only words whose bounds add up to less than need cannot reach it, so it must hold one of
    # the others.
    essential, below = [], 0.0
    for query, bound in reversed(bounds):
        below += bound
        if below >= need:
            essential.append(query)
    if not essential:  # no chunk can reach need: rounding against the chunk that set it
        return None
    for kept in range(len(bounds), 0, -1):
        head, tail = bounds[:kept], bounds[kept:]
        if tail:
            merged = ("(" + " | ".join(q for q, _ in tail) + ")", sum(u for _, u in tail))
            items = sorted([*head, merged], key=lambda item: -item[1])
        else:
            items = head
        try:
            query = _threshold_tree(items, need)
        except _TooLarge:
            continue
        if not tail:
            return None if query is True else query
        anyone = " | ".join(essential)
        return anyone if query is True else f"({query}) & ({anyone})"
    return None


class _TooLarge(Exception):
    """A threshold query past ``THRESHOLD_QUERY_NODES`` nodes."""


def _threshold_tree(items: list[tuple[str, float]], need: float) -> str | bool:
    """The boolean query "the bounds of the items held add up to ``need``" over ``items``
    ``(tsquery, bound)`` sorted by bound, largest first: a tsquery, or True where it is any
    chunk holding one of them. Raises :class:`_TooLarge` past ``THRESHOLD_QUERY_NODES``."""
    rest = [0.0] * (len(items) + 1)
    for i in range(len(items) - 1, -1, -1):
        rest[i] = rest[i + 1] + items[i][1]
    nodes = 0

    def tree(i: int, need: float) -> str | bool | None:
        nonlocal nodes
        if need <= 0:
            return True
        if rest[i] < need:
            return None  # even every remaining word together falls short
        nodes += 1
        if nodes > THRESHOLD_QUERY_NODES:
            raise _TooLarge
        query, bound = items[i]
        holding = tree(i + 1, need - bound)
        without = tree(i + 1, need)
        left = query if holding is True else None if holding is None else f"({query} & {holding})"
        if left is None or without is True:
            return without
        return left if without is None else f"({left} | {without})"

    query = tree(0, need)
    # None: no chunk can reach need, which the chunk that set it contradicts (rounding): stay
    # a superset.
    return True if query is None else query


def bm25_sql(weights: TermWeights, boosts=()) -> tuple[str, list]:
    """SQL (with params) computing BM25 for the current ``django_rag_chunk`` row (each term's
    part times its idf and its query weight), plus the weight of every ``(phrase tsquery,
    weight)`` boost the row matches."""
    k1 = float(search_setting("BM25_K1"))
    b = float(search_setting("BM25_B"))
    sql = (
        "(SELECT coalesce(sum(q.idf * m.tf * (%s + 1) / (m.tf + %s * (1 - %s + %s * "
        "django_rag_chunk.fts_length / %s))), 0) "
        "FROM (SELECT u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf "
        # Only the query's lexemes are unnested: mark them with weight A, keep weight A.
        "FROM unnest(ts_filter(setweight(django_rag_chunk.search_vector, 'A', %s::text[]), "
        "'{a}')) u) m "
        "JOIN unnest(%s::text[], %s::float8[]) AS q(term, idf) ON q.term = m.lexeme)"
    )
    params = [k1, k1, b, b, weights.average_length, weights.terms, weights.terms, weights.scoring()]
    for tsquery, weight in boosts:
        sql += " + (CASE WHEN django_rag_chunk.search_vector @@ %s::tsquery THEN %s ELSE 0 END)"
        params += [tsquery, weight]
    return sql, params
