"""The bytes of an uploaded file, kept until its ingest job has parsed them."""

from __future__ import annotations

from django.db import models

from .documents import Document


class Upload(models.Model):
    """An uploaded file waiting for its ingest job (``ingest_bytes(..., background=True)``,
    the dashboard's upload form): the web process stores the bytes, the job parses them in a
    memory-limited child process (docs/security.md, "Uploads"). Deleted once the document is
    stored; kept after a failure, so the job can be retried."""

    document = models.OneToOneField(Document, on_delete=models.CASCADE, related_name="upload")
    filename = models.CharField(max_length=4096)
    data = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.filename
