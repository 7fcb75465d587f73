"""Collections, documents and chunks."""

from __future__ import annotations

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.db.models import Func

from ..exceptions import CollectionNotEmpty
from .fields import EmbeddingField
from .managers import ChunkQuerySet
from .vector_index import HNSW_EF_CONSTRUCTION, HNSW_INDEX, HNSW_M, EmbeddingIndex


class Collection(models.Model):
    """A named group of documents; searches can be scoped to one or more collections."""

    name = models.CharField(max_length=255, unique=True)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def delete(self, *args, **kwargs):
        count = self.documents.count()
        if count:
            raise CollectionNotEmpty(self.name, count)
        return super().delete(*args, **kwargs)


# Versions order the writes of one (collection, source_id): taken from this sequence when a
# document is submitted (before any embedding), so their order is the order of the calls.
VERSION_SEQUENCE = "django_rag_document_version"


class NextVersion(Func):
    """``nextval`` of the document version sequence (the column's database default)."""

    template = f"nextval('{VERSION_SEQUENCE}')"
    output_field = models.BigIntegerField()


class Document(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        PROCESSING = "processing", "Processing"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"

    # PROTECT: a collection with documents cannot be deleted (its chunks would be orphaned).
    collection = models.ForeignKey(Collection, on_delete=models.PROTECT, related_name="documents")
    source_id = models.CharField(max_length=512, blank=True, default="")
    title = models.CharField(max_length=500, blank=True, default="")
    content = models.TextField()
    content_hash = models.CharField(max_length=64)
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True, default="")
    chunk_count = models.PositiveIntegerField(default=0)
    original_filename = models.CharField(max_length=500, blank=True, default="")
    content_type = models.CharField(max_length=100, default="text/plain")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Submission order (django_rag.store.documents.next_versions): a replace deletes only the
    # older versions of its identity, and a write older than the identity's SourceVersion is
    # superseded (docs/architecture.md, "The newest version wins").
    version = models.BigIntegerField(db_default=NextVersion(), editable=False)

    # Set on what ingest returns: True when the call stored nothing because a newer version of
    # the same (collection, source_id) was written first (this is then that newer document).
    superseded = False

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["collection", "source_id"], name="django_rag_doc_source_idx"),
            models.Index(fields=["source_id"], name="django_rag_doc_source_only_idx"),
            models.Index(fields=["collection", "content_hash"], name="django_rag_doc_hash_idx"),
            GinIndex(
                fields=["metadata"], name="django_rag_doc_meta_idx", opclasses=["jsonb_path_ops"]
            ),
        ]

    def __str__(self) -> str:
        if self.title or self.original_filename or self.source_id:
            return self.title or self.original_filename or self.source_id
        # Untitled: its first words (unless the text was not loaded: a list deferring it).
        if "content" not in self.get_deferred_fields() and self.content.strip():
            words = self.content[:300].split()
            return " ".join(words[:8]) + ("…" if len(words) > 8 else "")
        return f"Document {self.pk}"


class SourceVersion(models.Model):
    """The newest version that replaced or deleted the documents of a (collection, source_id):
    a write of an older version comes too late and is superseded. Written under the identity's
    lock by the store; a deleted source keeps its row (a tombstone) so that an older job still
    queued for it cannot bring it back."""

    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="+")
    source_id = models.CharField(max_length=512)
    version = models.BigIntegerField()
    deleted = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["collection", "source_id"], name="django_rag_source_version_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source_id} @ {self.version}"


class Chunk(models.Model):
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    # Copied from the document so scoped searches filter chunks through one indexed column.
    collection = models.ForeignKey(Collection, on_delete=models.CASCADE, related_name="+")
    chunk_index = models.PositiveIntegerField()
    text = models.TextField()
    token_count = models.PositiveIntegerField(default=0)
    start_char = models.PositiveIntegerField(null=True, blank=True)
    end_char = models.PositiveIntegerField(null=True, blank=True)
    page_start = models.PositiveIntegerField(null=True, blank=True)
    page_end = models.PositiveIntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    embedding = EmbeddingField()
    embedding_model = models.CharField(max_length=255)
    search_vector = SearchVectorField(null=True, editable=False)
    # Number of lexeme occurrences in search_vector: the document length of BM25.
    fts_length = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ChunkQuerySet.as_manager()

    class Meta:
        ordering = ["document_id", "chunk_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["document", "chunk_index"], name="django_rag_chunk_unique_index"
            ),
            models.CheckConstraint(
                condition=models.Q(start_char__isnull=True)
                | models.Q(end_char__gte=models.F("start_char")),
                name="django_rag_chunk_offsets_ordered",
            ),
            models.CheckConstraint(
                condition=models.Q(page_start__isnull=True)
                | models.Q(page_end__gte=models.F("page_start")),
                name="django_rag_chunk_pages_ordered",
            ),
        ]
        indexes = [
            # Of the type VECTOR_INDEX_TYPE names when it is created (models.vector_index).
            EmbeddingIndex(
                name=HNSW_INDEX,
                fields=["embedding"],
                m=HNSW_M,
                ef_construction=HNSW_EF_CONSTRUCTION,
                opclasses=["vector_cosine_ops"],
            ),
            GinIndex(fields=["search_vector"], name="django_rag_chunk_fts_idx"),
            models.Index(fields=["embedding_model"], name="django_rag_chunk_model_idx"),
        ]

    def __str__(self) -> str:
        # "Handbook #3": the document's own label (title, file name, source id or first words)
        # and the chunk's index as the dashboard's document page shows it.
        return f"{self.document} #{self.chunk_index}"
