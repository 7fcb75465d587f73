"""Uploads waiting for their ingest job: the pending document and the file's bytes are stored
together; the job records what parsing found, and the bytes go once the document is stored."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..models import Document, Upload
from ..models.databases import write_db
from .documents import save_pending


def save_upload(document: Document, collection: str, *, filename: str, data: bytes) -> Document:
    """Store ``document`` (unsaved) as ``pending`` with the bytes of its file, in one
    transaction: a job never finds one without the other."""
    db = write_db()
    with transaction.atomic(using=db):
        save_pending(document, collection)
        Upload.objects.using(db).create(document=document, filename=filename, data=data)
    return document


def upload_of(document_id: int) -> Upload | None:
    """The stored upload of a pending document (on the write database: it was just written)."""
    return Upload.objects.using(write_db()).filter(document_id=document_id).first()


def record_parsed(document: Document, **fields: Any) -> None:
    """Save what parsing the upload found (``content``, ``content_hash``, ``title``,
    ``metadata``, ``content_type``) on the pending document, unless it completed meanwhile."""
    for name, value in fields.items():
        setattr(document, name, value)
    Document.objects.using(write_db()).filter(pk=document.pk).exclude(
        status=Document.Status.COMPLETED
    ).update(**fields)


def discard_upload(document_id: int) -> None:
    """Delete the bytes of a document's upload (its document is stored, or gone)."""
    Upload.objects.using(write_db()).filter(document_id=document_id).delete()


__all__ = ["discard_upload", "record_parsed", "save_upload", "upload_of"]
