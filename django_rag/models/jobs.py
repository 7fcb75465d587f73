"""Jobs: long-running work (re-embedding, background ingestion...) and its progress."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from ..conf import scrub_text


class Job(models.Model):
    """One long operation. Its ``done``/``total`` are updated as it goes, so commands and the
    dashboard can show progress from any process; ``cursor`` lets an interrupted job resume."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"

    class Kind(models.TextChoices):
        """Every kind of job; a task's kind is its name with dashes (see django_rag.tasks)."""

        INGEST = "ingest", "Ingest a document"
        REEMBED = "reembed", "Re-embed chunks"
        REEMBED_TASK = "reembed-task", "Re-embed (queued)"
        SWITCH = "embedding-switch", "Switch the embedding model"
        BUILD_GRAPH = "build-graph", "Build the graph"
        DETECT_COMMUNITIES = "detect-communities", "Detect communities"
        SUMMARIZE_COMMUNITIES = "summarize-communities", "Summarise communities"
        RUN_EVALUATION = "run-evaluation", "Run an evaluation"
        GENERATE_TEST_CASES = "generate-test-cases", "Generate test cases"

    kind = models.CharField(max_length=50, choices=Kind.choices)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    params = models.JSONField(default=dict)
    done = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    cursor = models.BigIntegerField(null=True, blank=True)
    result = models.JSONField(default=dict)
    error = models.TextField(blank=True, default="")
    task_id = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["kind", "status"], name="django_rag_job_kind_idx")]

    def __str__(self) -> str:
        return f"{self.kind} job {self.pk} ({self.status}, {self.done}/{self.total})"

    # --- lifecycle: pending -> running -> completed | failed (the one place that moves it) ----

    def start(self) -> None:
        """Mark the job running (again, for a retried or resumed job)."""
        self.status = self.Status.RUNNING
        self.error = ""
        type(self).objects.filter(pk=self.pk).update(status=self.status, error="")

    def finish(self, result: dict | None = None) -> None:
        """Mark the job completed with its result (a job already completed stays as it is)."""
        self.status = self.Status.COMPLETED
        self.result = result or {}
        self.finished_at = timezone.now()
        type(self).objects.filter(pk=self.pk).exclude(status=self.Status.COMPLETED).update(
            status=self.status, result=self.result, finished_at=self.finished_at
        )

    def fail(self, exc: BaseException) -> None:
        """Mark the job failed with the error's type and message."""
        self.status = self.Status.FAILED
        self.error = scrub_text(f"{type(exc).__name__}: {exc}")[:4000]
        self.finished_at = timezone.now()
        type(self).objects.filter(pk=self.pk).update(
            status=self.status, error=self.error, finished_at=self.finished_at
        )

    def report(self, done: int, total: int) -> None:
        """Record progress (any process can read it)."""
        self.done, self.total = done, total
        type(self).objects.filter(pk=self.pk).update(done=done, total=total)
