"""Evaluation: test cases (a question and what should be retrieved) and runs."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .documents import Chunk, Collection, Document


class TestCase(models.Model):
    """A question and the chunks (or documents) a good search returns for it."""

    __test__ = False  # not a pytest test class

    class Origin(models.TextChoices):
        MANUAL = "manual", "Manual"
        GENERATED = "generated", "Generated"
        IMPORTED = "imported", "Imported"

    class Level(models.TextChoices):
        CHUNK = "chunk", "Chunk"
        DOCUMENT = "document", "Document"

    question = models.TextField()
    collection = models.ForeignKey(
        Collection,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="test_cases",
        help_text="Searched when the run names no collection.",
    )
    # Whether relevance is judged per chunk or per document (BEIR judges documents).
    level = models.CharField(max_length=10, choices=Level.choices, default=Level.CHUNK)
    reference_answer = models.TextField(blank=True, default="")
    origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.MANUAL)
    source_chunk = models.ForeignKey(
        Chunk, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    external_id = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.question[:80]


class Relevance(models.Model):
    """One relevant chunk or document of a test case, with a graded relevance (1 = relevant)."""

    test_case = models.ForeignKey(TestCase, on_delete=models.CASCADE, related_name="relevance")
    chunk = models.ForeignKey(Chunk, null=True, blank=True, on_delete=models.CASCADE)
    document = models.ForeignKey(Document, null=True, blank=True, on_delete=models.CASCADE)
    grade = models.PositiveSmallIntegerField(default=1)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(chunk__isnull=False, document__isnull=True)
                | Q(chunk__isnull=True, document__isnull=False),
                name="django_rag_relevance_chunk_xor_document",
            ),
            models.UniqueConstraint(
                fields=["test_case", "chunk"], name="django_rag_relevance_unique_chunk"
            ),
            models.UniqueConstraint(
                fields=["test_case", "document"], name="django_rag_relevance_unique_document"
            ),
        ]

    def __str__(self) -> str:
        target = f"chunk {self.chunk_id}" if self.chunk_id else f"document {self.document_id}"
        return f"{target} (grade {self.grade})"


class Run(models.Model):
    """One evaluation: the configuration it used, its metrics and every case's results."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    mode = models.CharField(max_length=20)
    # Embedder model and dimensions, mode, weights, reranker, limit, scope...
    config = models.JSONField(default=dict)
    metrics = models.JSONField(default=dict)
    results = models.JSONField(default=list)
    test_case_count = models.PositiveIntegerField(default=0)
    usage = models.JSONField(default=dict)
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"Run {self.pk} ({self.mode}, {self.status})"
