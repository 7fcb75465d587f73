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

A query is parsed with web-search syntax (:mod:`~django_rag.models.fulltext_query`);
candidates come from the GIN index; BM25 is computed in SQL from the chunk's own term
frequencies and those statistics (:mod:`~django_rag.models.bm25`, which reads them). This module
holds the statistics' models and re-exports the names of both.
"""

from __future__ import annotations

from django.db import connections, models
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from .bm25 import (  # noqa: F401 (re-exported: the statistics readers and BM25 SQL)
    TermWeights,
    bm25_sql,
    corpus_statistics,
    limit_terms,
    query_term_weight,
    term_frequencies,
    term_statistics,
    term_weights,
)
from .fulltext_query import (  # noqa: F401 (re-exported: query parsing)
    SYNTAXES,
    FulltextQuery,
    parse_query,
    quote_terms,
    split_query,
)


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


# Number of lexeme occurrences in a tsvector (a lexeme without positions counts once).
LENGTH_SQL = (
    "(SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest({v}) u)"
)
