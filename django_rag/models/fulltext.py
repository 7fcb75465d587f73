"""Full-text search with BM25 ranking in plain PostgreSQL: the statistics and the SQL.

Each chunk has a ``search_vector`` (tsvector, GIN-indexed) and ``fts_length`` (its number of
lexeme occurrences). Statement-level triggers on the chunk table (migrations 0002, 0006 and
0007) record, in the same transaction as every insert, update or delete of chunks, whatever path
made it, how the document frequency of each lexeme and the corpus size changed in the chunk's
collection: as rows appended to ``django_rag_term_delta`` / ``django_rag_corpus_delta``.
Appending never waits for another writer, so concurrent writers cannot deadlock on the
statistics. The statistics of a term in a collection are its row in ``django_rag_term`` plus its
pending deltas; :func:`django_rag.store.compact_statistics` folds the deltas into the base rows
(the store runs it after each write; one compactor at a time), which changes no figure a reader
sees. Readers sum the collections a search is scoped to, or all of them.

Beside each term's document frequency the rows keep a bound of what one chunk can get from the
term (migration 0008): the largest term frequency and the smallest length among the chunks
containing it. Inserts widen them (greatest / least when folded); deletes leave them, so they
may be loose but never too tight; :func:`django_rag.store.recount_term_bounds` tightens them.

A query is parsed with web-search syntax; candidates come from the GIN index; BM25 is computed
in SQL from the chunk's own term frequencies and those statistics.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connections,
    models,
    transaction,
)
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from ..conf import get_setting, max_query_terms, search_setting
from ..exceptions import ConfigurationError, InvalidOption

# The statistics are kept per collection: a search scoped to collections ranks with theirs (as a
# search engine ranks within its index), so one tenant's documents never move another's scores.
# ``collection`` is a foreign key without a database constraint: a constraint would make every
# appended delta row lock the collection row (KEY SHARE, once per row) in the writers' hot path.
# Deleting a collection deletes its rows (CASCADE, through Django's collector), after taking the
# compaction lock (see delete_collection_statistics below).


class TermStatistic(models.Model):
    """How many chunks of ``collection`` contain ``term`` (a lexeme of the text search
    configuration)."""

    pk = models.CompositePrimaryKey("term", "collection")
    term = models.TextField()
    collection = models.ForeignKey(
        "django_rag.Collection", on_delete=models.CASCADE, db_constraint=False, related_name="+"
    )
    document_frequency = models.BigIntegerField(default=0)
    # What a chunk can get from the term in BM25 at best: the largest term frequency and the
    # smallest length among the chunks containing it. Inserts widen them; deletes leave them
    # (a looser bound is still a bound); see TermWeights.upper_bound.
    max_tf = models.IntegerField(null=True)
    min_length = models.IntegerField(null=True)

    class Meta:
        db_table = "django_rag_term"

    def __str__(self) -> str:
        return f"{self.term}: {self.document_frequency}"


class CorpusStatistic(models.Model):
    """One row per collection: how many of its chunks are indexed for full-text search and
    their total length."""

    collection = models.OneToOneField(
        "django_rag.Collection",
        primary_key=True,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="+",
    )
    chunk_count = models.BigIntegerField(default=0)
    total_length = models.BigIntegerField(default=0)

    class Meta:
        db_table = "django_rag_corpus"

    def __str__(self) -> str:
        return f"{self.chunk_count} chunks, {self.total_length} terms"


class TermDelta(models.Model):
    """A change of a term's document frequency in a collection, not yet folded into
    :class:`TermStatistic`."""

    term = models.TextField()
    # No index of its own (appends stay cheap); the (term, collection) index serves readers.
    collection = models.ForeignKey(
        "django_rag.Collection",
        on_delete=models.CASCADE,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    delta = models.BigIntegerField()
    # The bounds of the chunks inserted (NULL for deletes): compaction folds them with
    # greatest() / least().
    max_tf = models.IntegerField(null=True)
    min_length = models.IntegerField(null=True)

    class Meta:
        db_table = "django_rag_term_delta"
        indexes = [models.Index(fields=["term", "collection"], name="django_rag_term_delta_idx")]

    def __str__(self) -> str:
        return f"{self.term}: {self.delta:+d}"


class CorpusDelta(models.Model):
    """A change of a collection's corpus size not yet folded into :class:`CorpusStatistic`."""

    collection = models.ForeignKey(
        "django_rag.Collection",
        on_delete=models.CASCADE,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    chunk_count = models.BigIntegerField()
    total_length = models.BigIntegerField()

    class Meta:
        db_table = "django_rag_corpus_delta"

    def __str__(self) -> str:
        return f"{self.chunk_count:+d} chunks, {self.total_length:+d} terms"


# Held by the one compactor at a time (try-lock) and by a collection delete (waits): a delete
# then never races a compactor folding the deltas of the collection it removes.
STATISTICS_LOCK = "django_rag:statistics:compact"


@receiver(pre_delete, sender="django_rag.Collection", dispatch_uid="django_rag.statistics")
def delete_collection_statistics(sender, instance, using, **kwargs):
    """Before the collector deletes a collection's statistics rows (CASCADE), wait for a
    running compactor and keep others out until the delete commits: otherwise a compactor
    could fold the collection's deltas into base rows after the delete read them."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [STATISTICS_LOCK])


# --- reading the statistics ---------------------------------------------------------------------


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


# --- queries and BM25 ----------------------------------------------------------------------------

_PHRASE = re.compile(r'"([^"]*)"')
_OPERATORS = {"OR", "AND"}

# Number of lexeme occurrences in a tsvector (a lexeme without positions counts once).
LENGTH_SQL = (
    "(SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest({v}) u)"
)


SYNTAXES = ("natural", "websearch")


@dataclass
class FulltextQuery:
    """A parsed query: ``match`` selects candidates, ``exclude`` removes some, ``terms`` score,
    ``boosts`` (phrase tsquery, its lexemes) add to the score of chunks holding the phrase."""

    match: str | None = None
    exclude: str | None = None
    terms: list[str] = field(default_factory=list)
    phrases: bool = False  # match requires quoted phrases
    boosts: list[tuple[str, list[str]]] = field(default_factory=list)
    # One word of the query for each scoring lexeme (the first giving it): the text handed to
    # a BM25 index, which stems it again (lexemes are not always stable under stemming).
    words: list[str] = field(default_factory=list)
    # Scoring lexeme -> that word, in query order (how limit_terms keeps words in step).
    word_of: dict[str, str] = field(default_factory=dict)
    # How many distinct words limit_terms left out (SEARCH["MAX_QUERY_TERMS"]).
    dropped_terms: int = 0


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


def parse_query(
    query: str,
    *,
    syntax: str = "natural",
    config: str | None = None,
    using: str = "default",
) -> FulltextQuery:
    """Parse a full-text query. Words are stemmed and stop words dropped by the text search
    configuration; any input is safe, and one with no searchable word gives an empty query.

    ``syntax="natural"`` (the default: questions are not queries): every word may match,
    whether quoted or after a minus sign; a quoted phrase adds to the score of chunks that hold
    it but is never required. ``syntax="websearch"``: words (any may match), ``"exact
    phrases"`` (must match) and ``-word`` (must not match).
    """
    if syntax not in SYNTAXES:
        raise InvalidOption(f"syntax must be one of {', '.join(SYNTAXES)}, got {syntax!r}")
    config = config or get_setting("TEXT_SEARCH_CONFIG")
    free, phrases, excluded = split_query(query)
    if syntax == "natural":
        free, excluded = free + excluded, []
    sql = """
        SELECT
            ARRAY(SELECT lexeme FROM unnest(to_tsvector(%(config)s::regconfig, %(free)s))),
            ARRAY(SELECT lexeme FROM unnest(to_tsvector(%(config)s::regconfig, %(phrases)s))),
            ARRAY(SELECT lexeme FROM unnest(to_tsvector(%(config)s::regconfig, %(excluded)s))),
            ARRAY(SELECT q::text FROM unnest(%(phrase_list)s::text[]) AS p,
                  phraseto_tsquery(%(config)s::regconfig, p) AS q WHERE numnode(q) > 0),
            ARRAY(SELECT array_to_string(ARRAY(
                      SELECT lexeme FROM unnest(to_tsvector(%(config)s::regconfig, p))), ' ')
                  FROM unnest(%(phrase_list)s::text[]) AS p,
                  phraseto_tsquery(%(config)s::regconfig, p) AS q WHERE numnode(q) > 0),
            ARRAY(SELECT ARRAY[s.w, s.lexeme] FROM (
                      SELECT DISTINCT ON (u.lexeme) x.w, x.n, u.lexeme
                      FROM unnest(%(words)s::text[]) WITH ORDINALITY AS x(w, n),
                           unnest(to_tsvector(%(config)s::regconfig, x.w)) AS u
                      ORDER BY u.lexeme, x.n) s ORDER BY s.n, s.lexeme)
    """
    params = {
        "config": config,
        "free": " ".join(free),
        "phrases": " ".join(phrases),
        "excluded": " ".join(excluded),
        "phrase_list": phrases,
        "words": [*free, *" ".join(phrases).split()],
    }
    connection = connections[using]
    # Inside a transaction a savepoint keeps a rejected configuration from breaking it; in
    # autocommit mode the statement is its own transaction (no BEGIN/COMMIT round trips).
    guard = transaction.atomic(using=using) if connection.in_atomic_block else nullcontext()
    try:
        with guard, connection.cursor() as cursor:
            cursor.execute(sql, params)
            free_terms, phrase_terms, excluded_terms, phrase_queries, phrase_lexemes, pairs = (
                cursor.fetchone()
            )
    except (OperationalError, InterfaceError):
        raise  # a lost connection, not a bad configuration: callers and tasks retry it
    except DatabaseError as exc:
        raise ConfigurationError(
            "TEXT_SEARCH_CONFIG", config, f"PostgreSQL rejected it ({exc}).".strip()
        ) from exc
    terms = list(dict.fromkeys([*free_terms, *phrase_terms]))
    if not terms:
        return FulltextQuery()
    # Each scoring lexeme's word, in the order the words come in the query.
    word_of = {lexeme: word for word, lexeme in pairs}
    words = [word for word, _ in pairs]
    if syntax == "natural":
        # A phrase of one word is just that word; longer ones boost the chunks that hold them.
        boosts = [
            (q, lexemes.split())
            for q, lexemes in zip(phrase_queries, phrase_lexemes, strict=True)
            if len(lexemes.split()) > 1
        ]
        return FulltextQuery(
            match=quote_terms(terms),
            terms=terms,
            boosts=boosts,
            words=list(dict.fromkeys(words)),
            word_of=word_of,
        )
    match = " & ".join(f"({q})" for q in phrase_queries) if phrase_queries else quote_terms(terms)
    exclude = quote_terms(excluded_terms) or None
    return FulltextQuery(
        match=match,
        exclude=exclude,
        terms=terms,
        phrases=bool(phrase_queries),
        words=list(dict.fromkeys(words)),
        word_of=word_of,
    )


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
            total += self.idf[i] * part
        total += sum(w for _, w in boosts)
        return total * (1 + 1e-9) + 1e-12

    def boosts(self, parsed: FulltextQuery) -> list[tuple[str, float]]:
        """(phrase tsquery, weight) of a natural query's phrases: a chunk holding the phrase
        scores as if the phrase were one more word, as rare as its words together."""
        weight = dict(zip(self.terms, self.idf, strict=True))
        return [(q, sum(weight.get(t, 0.0) for t in lexemes)) for q, lexemes in parsed.boosts]


def term_weights(
    terms: list[str], using: str = "default", collection_ids: Sequence[int] | None = None
) -> TermWeights:
    """Document frequencies and BM25 inverse document frequencies of ``terms``, from the
    statistics of the collections ``collection_ids`` (None: the whole database)."""
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
    Phrase boosts are kept when all their words are; required phrases and excluded words of
    web-search syntax still apply whole. A query within the cap comes back as it was, so
    normal queries rank exactly as without a cap. ``weights`` (of ``parsed.terms``) are read
    from the statistics when not given, and returned for the kept terms."""
    cap = max_query_terms()
    if cap is None or len(parsed.terms) <= cap:
        return parsed, weights
    if weights is None or weights.terms != parsed.terms:
        weights = term_weights(parsed.terms, using=using, collection_ids=collection_ids)
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
    )
    return capped, capped_weights


def bm25_sql(weights: TermWeights, boosts=()) -> tuple[str, list]:
    """SQL (with params) computing BM25 for the current ``django_rag_chunk`` row, plus the
    weight of every ``(phrase tsquery, weight)`` boost the row matches."""
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
    params = [k1, k1, b, b, weights.average_length, weights.terms, weights.terms, weights.idf]
    for tsquery, weight in boosts:
        sql += " + (CASE WHEN django_rag_chunk.search_vector @@ %s::tsquery THEN %s ELSE 0 END)"
        params += [tsquery, weight]
    return sql, params
