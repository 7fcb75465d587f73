"""Parsing a full-text query: plain words, "quoted phrases", OR and -excluded terms (web-search
syntax, or natural), each word turned into the lexemes PostgreSQL indexes, in one bounded
statement.
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from dataclasses import dataclass, field

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from ..conf import get_setting
from ..exceptions import ConfigurationError, InvalidOption

_PHRASE = re.compile(r'"([^"]*)"')
_OPERATORS = {"OR", "AND"}


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
    # Scoring lexeme -> how many times the query holds it (its query-term frequency, weighted
    # by SEARCH["BM25_K3"]; a lexeme missing here counts once).
    counts: dict[str, int] = field(default_factory=dict)


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
                      ORDER BY u.lexeme, x.n) s ORDER BY s.n, s.lexeme),
            ARRAY(SELECT ARRAY[lexeme, coalesce(array_length(positions, 1), 1)::text]
                  FROM unnest(to_tsvector(%(config)s::regconfig, %(counted)s)))
    """
    params = {
        "config": config,
        "free": " ".join(free),
        "phrases": " ".join(phrases),
        "excluded": " ".join(excluded),
        "phrase_list": phrases,
        "words": [*free, *" ".join(phrases).split()],
        # Every scoring word once per occurrence, for the counts (a tsvector keeps at most 256
        # positions of a lexeme: a count stops there).
        "counted": " ".join([*free, *phrases]),
    }
    connection = connections[using]
    # Inside a transaction a savepoint keeps a rejected configuration from breaking it; in
    # autocommit mode the statement is its own transaction (no BEGIN/COMMIT round trips).
    guard = transaction.atomic(using=using) if connection.in_atomic_block else nullcontext()
    try:
        with guard, connection.cursor() as cursor:
            cursor.execute(sql, params)
            (
                free_terms,
                phrase_terms,
                excluded_terms,
                phrase_queries,
                phrase_lexemes,
                pairs,
                occurrences,
            ) = cursor.fetchone()
    except (OperationalError, InterfaceError):
        raise  # a lost connection, not a bad configuration: callers and tasks retry it
    except DatabaseError as exc:
        raise ConfigurationError(
            "TEXT_SEARCH_CONFIG", config, f"PostgreSQL rejected it ({exc}).".strip()
        ) from exc
    terms = list(dict.fromkeys([*free_terms, *phrase_terms]))
    if not terms:
        return FulltextQuery()
    counted = {lexeme: int(n) for lexeme, n in occurrences}
    counts = {term: max(counted.get(term, 1), 1) for term in terms}
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
            counts=counts,
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
        counts=counts,
    )
