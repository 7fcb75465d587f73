"""Jobs: long-running work (re-embedding, background ingestion...) and its progress."""

from __future__ import annotations

from datetime import timedelta

from django.db import models, router
from django.utils import timezone

from ..conf import scrub_text
from .databases import on_live_connection


class Job(models.Model):
    """One long operation. Its ``done``/``total`` are updated as it goes, so commands and the
    dashboard can show progress from any process; ``cursor`` lets an interrupted job resume."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        # Overtaken: a newer version of its (collection, source_id) was stored or deleted it
        # first, so this job's older version was not written (nothing to retry).
        SUPERSEDED = "superseded", "Superseded"

    class Kind(models.TextChoices):
        """Every kind of job; the task that runs each is django_rag.background.TASK_FOR_KIND."""

        INGEST = "ingest", "Ingest a document"
        REEMBED = "reembed", "Re-embed chunks"
        REEMBED_TASK = "reembed-task", "Re-embed (queued)"
        SWITCH = "embedding-switch", "Switch the embedding model"
        BUILD_GRAPH = "build-graph", "Build the graph"
        DETECT_COMMUNITIES = "detect-communities", "Detect communities"
        SUMMARIZE_COMMUNITIES = "summarize-communities", "Summarise communities"
        RUN_EVALUATION = "run-evaluation", "Run an evaluation"
        GENERATE_TEST_CASES = "generate-test-cases", "Generate test cases"
        SYNC_ROW = "sync-row", "Index a changed row"
        SYNC = "sync", "Reconcile indexed models"

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
    # Where the job was queued: "celery", "thread", "worker" (a rag_worker process claims it)
    # or "inline"; blank for work a command ran itself (a foreground re-embed).
    runner = models.CharField(max_length=10, blank=True, default="")
    # Who runs it now (host:pid[:thread]), when it started, and when it last showed signs of
    # life: a running job whose heartbeat is older than JOBS["STALLED_AFTER"] is stalled.
    worker = models.CharField(max_length=255, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # A job queued again after a transient failure waits until then (backoff).
    not_before = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["kind", "status"], name="django_rag_job_kind_idx"),
            # rag_worker's claim: the oldest pending job queued for it.
            models.Index(
                fields=["runner", "status", "created_at"], name="django_rag_job_queue_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} job {self.pk} ({self.status}, {self.done}/{self.total})"

    # --- lifecycle: pending -> running -> completed | failed (the one place that moves it) ----

    def start(self) -> None:
        """Mark the job running (again, for a retried or resumed job); counts an attempt once
        per run (a task and the service it calls may both start the same job)."""
        now = timezone.now()
        self.status = self.Status.RUNNING
        self.error = ""
        self.started_at = self.heartbeat_at = now
        changes = {"status": self.status, "error": "", "started_at": now, "heartbeat_at": now}
        if not getattr(self, "_attempt_counted", False):
            self._attempt_counted = True
            changes["attempts"] = models.F("attempts") + 1
        # A connection that died while the runner waited for work is replaced, not a failure.
        self._write({**changes, "finished_at": None})

    def finish(self, result: dict | None = None) -> None:
        """Mark the job completed with its result (a job already completed stays as it is)."""
        self.status = self.Status.COMPLETED
        self.result = result or {}
        self.finished_at = timezone.now()
        # The work is stored: a connection lost just now must not turn it into a failure.
        self._write(
            {"status": self.status, "result": self.result, "finished_at": self.finished_at},
            unless_completed=True,
        )

    def fail(self, exc: BaseException) -> None:
        """Mark the job failed with the error's type and message."""
        self.status = self.Status.FAILED
        self.error = scrub_text(f"{type(exc).__name__}: {exc}")[:4000]
        self.finished_at = timezone.now()
        self._end()

    def _end(self) -> None:
        # The job must not stay "running" with no runner: written on a fresh connection when
        # the failure broke this one.
        self._write(
            {"status": self.status, "error": self.error, "finished_at": self.finished_at},
            unless_completed=True,
        )

    def _write(self, changes: dict, *, unless_completed: bool = False) -> None:
        """Update this job's row on the write database, on a fresh connection when the current
        one is lost; ``unless_completed``: a late end of a duplicate run never undoes a
        completed job."""

        def update() -> int:
            rows = type(self).objects.filter(pk=self.pk)
            if unless_completed:
                rows = rows.exclude(status=self.Status.COMPLETED)
            return rows.update(**changes)

        on_live_connection(router.db_for_write(type(self)), update)

    def supersede(self, exc: BaseException) -> None:
        """Mark the job superseded: a newer version of what it was writing got there first,
        so its work is void and nothing is left to retry."""
        self.status = self.Status.SUPERSEDED
        self.error = scrub_text(str(exc))[:4000]
        self.finished_at = timezone.now()
        self._end()

    def report(self, done: int, total: int) -> None:
        """Record progress (any process can read it); progress is also a heartbeat."""
        self.done, self.total = done, total
        self.heartbeat_at = timezone.now()
        type(self).objects.filter(pk=self.pk).update(
            done=done, total=total, heartbeat_at=self.heartbeat_at
        )

    def beat(self) -> None:
        """Record that the job's worker is alive (see :func:`django_rag.background.stalled`)."""
        self.heartbeat_at = timezone.now()
        type(self).objects.filter(pk=self.pk, status=self.Status.RUNNING).update(
            heartbeat_at=self.heartbeat_at
        )

    # --- for display ----------------------------------------------------------------------

    @property
    def duration(self):
        """How long it ran (until now while running), or None before it started."""
        if self.started_at is None:
            return None
        end = self.finished_at or timezone.now()
        return max(end - self.started_at, timedelta(0))

    def is_stalled(self, after_seconds: float) -> bool:
        """Pending or running, and no sign of life for ``after_seconds``."""
        if self.status not in (self.Status.PENDING, self.Status.RUNNING):
            return False
        last = self.heartbeat_at or self.created_at
        return (timezone.now() - last).total_seconds() > after_seconds


class IndexedModelStatus(Job):
    """A proxy through which the Django admin lists indexed models and their sync state (the
    admin shows registered models; this page is not a table of its own)."""

    class Meta:
        proxy = True
        verbose_name = "indexed model"
        verbose_name_plural = "indexed models"
