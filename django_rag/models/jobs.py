"""Jobs: long-running work (re-embedding, background ingestion...) and its progress."""

from __future__ import annotations

from django.db import models


class Job(models.Model):
    """One long operation. Its ``done``/``total`` are updated as it goes, so commands and the
    dashboard can show progress from any process; ``cursor`` lets an interrupted job resume."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"

    kind = models.CharField(max_length=50)
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
