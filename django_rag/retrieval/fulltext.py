"""Full-text search with BM25 ranking in plain PostgreSQL.

Each chunk has a ``search_vector`` (tsvector, GIN-indexed) and ``fts_length`` (its number of
lexeme occurrences). Database triggers keep the document frequency of every lexeme and the
corpus size in ``django_rag_term`` / ``django_rag_corpus``. A query is parsed with web-search
syntax; candidates come from the GIN index; BM25 is computed in SQL from the chunk's own term
frequencies and those statistics.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from django.db import DatabaseError, connections, transaction

from ..conf import get_setting
from ..exceptions import ConfigurationError

_PHRASE = re.compile(r'"([^"]*)"')
_OPERATORS = {"OR", "AND"}

# Number of lexeme occurrences in a tsvector (a lexeme without positions counts once).
_LENGTH_SQL = (
    "(SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest({v}) u)"
)


@dataclass
class FulltextQuery:
    """A parsed query: ``match`` selects candidates, ``exclude`` removes some, ``terms`` score."""

    match: str | None = None
    exclude: str | None = None
    terms: list[str] = field(default_factory=list)
    phrases: bool = False  # match requires quoted phrases


def _quote(lexeme: str) -> str:
    """A lexeme as a tsquery literal (the text is cast to tsquery, never parsed as SQL)."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def quote_terms(lexemes: list[str]) -> str:
    """A tsquery matching any of ``lexemes``."""
    return " | ".join(_quote(t) for t in lexemes)


def split_query(query: str) -> tuple[list[str], list[str], list[str]]:
    """Split web-search syntax into (free words, quoted phrases, excluded words)."""
    phrases = [p.strip() for p in _PHRASE.findall(query) if p.strip()]
    free: list[str] = []
    excluded: list[str] = []
    for token in _PHRASE.sub(" ", query).split():
        if token in _OPERATORS:
            continue
        if token.startswith("-") and len(token) > 1:
            excluded.append(token[1:])
        else:
            free.append(token)
    return free, phrases, excluded


def parse_query(query: str, *, config: str | None = None, using: str = "default") -> FulltextQuery:
    """Parse web-search syntax: words (any may match), ``"exact phrases"`` (must match) and
    ``-word`` (must not match). Words are stemmed and stop words dropped by the text search
    configuration; any input is safe, and one with no searchable word gives an empty query.
    """
    config = config or get_setting("TEXT_SEARCH_CONFIG")
    free, phrases, excluded = split_query(query)
    sql = """
        SELECT
            ARRAY(SELECT lexeme FROM unnest(to_tsvector(%(config)s::regconfig, %(free)s))),
            ARRAY(SELECT lexeme FROM unnest(to_tsvector(%(config)s::regconfig, %(phrases)s))),
            ARRAY(SELECT lexeme FROM unnest(to_tsvector(%(config)s::regconfig, %(excluded)s))),
            ARRAY(SELECT q::text FROM unnest(%(phrase_list)s::text[]) AS p,
                  phraseto_tsquery(%(config)s::regconfig, p) AS q WHERE numnode(q) > 0)
    """
    params = {
        "config": config,
        "free": " ".join(free),
        "phrases": " ".join(phrases),
        "excluded": " ".join(excluded),
        "phrase_list": phrases,
    }
    try:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(sql, params)
            free_terms, phrase_terms, excluded_terms, phrase_queries = cursor.fetchone()
    except DatabaseError as exc:
        raise ConfigurationError(
            "TEXT_SEARCH_CONFIG", config, f"PostgreSQL rejected it ({exc}).".strip()
        ) from exc
    terms = list(dict.fromkeys([*free_terms, *phrase_terms]))
    if phrase_queries:
        match = " & ".join(f"({q})" for q in phrase_queries)
    elif terms:
        match = quote_terms(terms)
    else:
        return FulltextQuery()
    exclude = quote_terms(excluded_terms) or None
    return FulltextQuery(match=match, exclude=exclude, terms=terms, phrases=bool(phrase_queries))


@dataclass
class TermWeights:
    """BM25 statistics of a query's terms, from the trigger-maintained tables."""

    terms: list[str]
    frequencies: list[int]  # chunks containing each term
    idf: list[float]
    average_length: float

    def upper_bound(self, terms: list[str]) -> float:
        """The most a chunk can score from ``terms`` alone (BM25's tf part is below k1 + 1)."""
        k1 = float(get_setting("SEARCH")["BM25_K1"])
        weight = dict(zip(self.terms, self.idf, strict=True))
        return sum(weight[t] for t in terms) * (k1 + 1)


def term_weights(terms: list[str], using: str = "default") -> TermWeights:
    """Document frequencies and BM25 inverse document frequencies of ``terms``."""
    from ..models import CorpusStatistic, TermStatistic

    corpus = CorpusStatistic.objects.using(using).filter(pk=1).first()
    total = corpus.chunk_count if corpus else 0
    average_length = (corpus.total_length / total) if corpus and total else 1.0
    stored = dict(
        TermStatistic.objects.using(using)
        .filter(term__in=terms)
        .values_list("term", "document_frequency")
    )
    frequencies = [max(0, stored.get(term, 0)) for term in terms]
    # Lucene's BM25 idf: never negative, even for a term in most chunks.
    idf = [math.log(1 + (total - df + 0.5) / (df + 0.5)) for df in frequencies]
    return TermWeights(terms, frequencies, idf, max(average_length, 1.0))


def bm25_sql(weights: TermWeights) -> tuple[str, list]:
    """SQL (with params) computing BM25 for the current ``django_rag_chunk`` row."""
    k1 = float(get_setting("SEARCH")["BM25_K1"])
    b = float(get_setting("SEARCH")["BM25_B"])
    sql = (
        "(SELECT coalesce(sum(q.idf * m.tf * (%s + 1) / (m.tf + %s * (1 - %s + %s * "
        "django_rag_chunk.fts_length / %s))), 0) "
        "FROM (SELECT u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf "
        # Only the query's lexemes are unnested: mark them with weight A, keep weight A.
        "FROM unnest(ts_filter(setweight(django_rag_chunk.search_vector, 'A', %s::text[]), "
        "'{a}')) u) m "
        "JOIN unnest(%s::text[], %s::float8[]) AS q(term, idf) ON q.term = m.lexeme)"
    )
    return sql, [k1, k1, b, b, weights.average_length, weights.terms, weights.terms, weights.idf]


def search_vectors(
    texts: list[str], *, config: str | None = None, using: str = "default"
) -> list[tuple[str, int]]:
    """``(tsvector text, length)`` for each text, to store with new chunks in one INSERT."""
    if not texts:
        return []
    config = config or get_setting("TEXT_SEARCH_CONFIG")
    sql = f"""
        SELECT v::text, {_LENGTH_SQL.format(v="v")}
        FROM unnest(%s::text[]) WITH ORDINALITY AS t(text, n),
             to_tsvector(%s::regconfig, t.text) AS v
        ORDER BY t.n
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [texts, config])
        return [(vector, int(length)) for vector, length in cursor.fetchall()]


def index_chunks(*, document_id=None, config: str | None = None, using: str = "default") -> int:
    """(Re)compute ``search_vector`` and ``fts_length`` of a document's chunks, or of all chunks.

    Run it for every chunk after changing ``TEXT_SEARCH_CONFIG``; the statistics follow through
    the triggers. Returns the number of chunks updated.
    """
    config = config or get_setting("TEXT_SEARCH_CONFIG")
    where, params = (
        ("WHERE document_id = %s", [config, document_id]) if document_id else ("", [config])
    )
    sql = f"""
        UPDATE django_rag_chunk c SET search_vector = s.vector, fts_length = s.length
        FROM (
            SELECT id, vector, {_LENGTH_SQL.format(v="vector")} AS length
            FROM (SELECT id, to_tsvector(%s::regconfig, text) AS vector
                  FROM django_rag_chunk {where}) t
        ) s
        WHERE c.id = s.id
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
