"""Corpus statistics for BM25, kept by database triggers on the chunk table.

Triggers (migration 0002) update these tables in the same transaction as every insert, update
or delete of chunks, whatever path made it (ingest, replace, delete, admin, a cascade), so the
statistics are never stale.
"""

from django.db import models


class TermStatistic(models.Model):
    """How many chunks contain ``term`` (a lexeme of the text search configuration)."""

    term = models.TextField(primary_key=True)
    document_frequency = models.BigIntegerField(default=0)

    class Meta:
        db_table = "django_rag_term"

    def __str__(self) -> str:
        return f"{self.term}: {self.document_frequency}"


class CorpusStatistic(models.Model):
    """One row: how many chunks are indexed for full-text search and their total length."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    chunk_count = models.BigIntegerField(default=0)
    total_length = models.BigIntegerField(default=0)

    class Meta:
        db_table = "django_rag_corpus"

    def __str__(self) -> str:
        return f"{self.chunk_count} chunks, {self.total_length} terms"
