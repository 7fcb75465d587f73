"""Keeping registered models' rows and their documents in step.

- :func:`schedule`: what the signals call; on commit, each changed row gets a version and a
  ``sync-row`` job in the configured background mode.
- :func:`sync_row`: the job's body. It reads the row as it is now, so whatever order jobs run
  in, the last one to write reflects the last commit; and the version taken at commit makes a
  late, older job superseded instead of overwriting a newer one.
- :func:`reconcile`: what ``rag_sync`` runs, in batches: adds missing rows, replaces changed
  ones, deletes orphans; unchanged rows cost two queries per batch (no embedding, no write).
- :func:`with_objects`: the rows behind search hits, one query per model, filtered by the
  registration's ``visible`` hook for a user.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import router, transaction

from .. import background
from ..exceptions import RagError
from ..ingestion.isolation import html_to_markdown_isolated
from ..ingestion.request import build_ingest_request
from ..ingestion.service import content_hash, ingest_many, ingest_source
from ..models import Document, Job
from ..models.databases import write_db
from ..results import SearchResult
from ..signals import span
from ..store import delete_source, next_versions, touch_source
from ..validation import clean_text, rejects_unknown_options
from .registry import IndexedModel, for_source, get, registered

logger = logging.getLogger("django_rag.sync")


# --- changes seen by signals ---------------------------------------------------------------


def schedule(
    spec: IndexedModel,
    pks: Sequence[Any],
    *,
    using: str | None = None,
    collections: Sequence[str] | None = None,
) -> None:
    """Sync the rows ``pks`` of ``spec`` once the current transaction commits (at once when
    none is open). ``collections`` names where a deleted row was indexed."""
    if not pks:
        return
    label, keys = spec.label, [str(pk) for pk in pks]

    def submit() -> None:
        _submit(label, keys, collections)

    # robust: a failure to queue is logged and left on the job row (the save itself has
    # committed); rag_sync repairs what was missed.
    transaction.on_commit(submit, using=using or router.db_for_write(spec.model), robust=True)


def _submit(label: str, pks: list[str], collections: Sequence[str] | None) -> None:
    spec = get(label)
    for pk, version in zip(pks, next_versions(len(pks)), strict=True):
        job = Job.objects.create(
            kind=Job.Kind.SYNC_ROW,
            params={
                "model": label,
                "pk": pk,
                "version": version,
                "collections": list(collections or []),
                # For the jobs page and its collection scope.
                "collection": spec.fixed_collection or (collections or [""])[0],
                "title": spec.source_id(pk),
            },
        )
        background.enqueue("sync_row", job)


def sync_row(
    model: str, pk: str, version: int, collections: Sequence[str] = (), **_: Any
) -> dict[str, Any]:
    """Bring one row's document in step with the row as it is now (the ``sync-row`` job)."""
    spec = get(model)
    source_id = spec.source_id(pk)
    with span("sync.row", model=spec.label, source_id=source_id) as s:
        row = spec.rows().filter(pk=pk).first()
        document = spec.document_for(row) if row is not None else None
        stored_in = _stored_collections([source_id]).get(source_id, set())
        if document is None or not document["text"].strip():
            targets = stored_in | set(collections)
            if spec.fixed_collection:
                targets.add(spec.fixed_collection)
            deleted = sum(delete_source(name, source_id, version=version) for name in targets)
            s.set(action="deleted", deleted=deleted)
            return {"action": "deleted", "deleted": deleted}
        collection = spec.collection_for(row)
        for name in sorted(stored_in - {collection}):  # the row moved to another collection
            delete_source(name, source_id, version=version)
        text, format = _converted(clean_text(document["text"]), spec.format)
        current = (
            Document.objects.using(write_db())
            .filter(
                collection__name=collection,
                source_id=source_id,
                status=Document.Status.COMPLETED,
            )
            .order_by("-version")
            .only("content_hash")
            .first()
        )
        if current is not None and current.content_hash == content_hash(text):
            touch_source(
                collection,
                source_id,
                version,
                title=document["title"],
                metadata=document["metadata"],
            )
            s.set(action="unchanged")
            return {"action": "unchanged", "document_id": current.pk}
        request = build_ingest_request(
            "sync",
            {
                "collection": collection,
                "source_id": source_id,
                "title": document["title"],
                "metadata": document["metadata"],
                "format": format,
                "replace": True,
            },
        )
        stored = ingest_source(text, request, version=version)
        action = "superseded" if stored.superseded else "indexed"
        s.set(action=action, document_id=stored.pk)
        return {"action": action, "document_id": stored.pk}


def _converted(text: str, format: str) -> tuple[str, str]:
    """A row's text as it is stored: HTML converted to Markdown (in a bounded worker, as any
    parse: isolation.py) before hashing, so an unchanged field compares equal to what was
    stored."""
    if format == "html":
        return html_to_markdown_isolated(text), "markdown"
    return text, format


def _stored_collections(source_ids: Sequence[str]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    rows = (
        Document.objects.using(write_db())
        .filter(source_id__in=list(source_ids))
        .values_list("source_id", "collection__name")
        .distinct()
    )
    for source_id, name in rows:
        found[source_id].add(name)
    return found


# --- reconciling (rag_sync) ----------------------------------------------------------------


@dataclass
class SyncReport:
    """What a reconcile did (or, with ``dry_run``, would do) for one model."""

    model: str
    rows: int = 0
    added: int = 0
    replaced: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.__dataclass_fields__}


def reconcile(
    model: str | None = None,
    *,
    collection: str | None = None,
    dry_run: bool = False,
    batch_size: int = 500,
    progress: Callable[[int, int], None] | None = None,
    **_: Any,
) -> list[SyncReport]:
    """Make the documents of registered models equal their indexed rows: add missing rows,
    replace changed ones (by content hash: unchanged text is never embedded again), update
    titles and metadata in place, delete documents whose row is gone or left the indexed set.

    ``model`` limits it to one registration, ``collection`` to the rows indexed there;
    ``dry_run`` counts without writing. Work goes in batches of ``batch_size`` rows, each
    written atomically, so a run killed half-way loses nothing and a new run picks up where it
    stopped at the cost of reading the rows already done (no embedding, no writes for them).
    """
    specs = [get(model)] if model else registered()
    reports = []
    for spec in specs:
        with span("sync.reconcile", model=spec.label, dry_run=dry_run) as s:
            report = _reconcile(spec, collection, dry_run, batch_size, progress)
            s.set(**{k: v for k, v in report.to_dict().items() if k != "errors"})
        reports.append(report)
    return reports


def _reconcile(spec, collection, dry_run, batch_size, progress) -> SyncReport:
    report = SyncReport(spec.label)
    rows = spec.rows().order_by("pk")
    total = rows.count()
    last = None
    while True:
        batch = list((rows.filter(pk__gt=last) if last is not None else rows)[:batch_size])
        if not batch:
            break
        last = batch[-1].pk
        _reconcile_batch(spec, batch, collection, dry_run, report)
        report.rows += len(batch)
        if progress is not None:
            progress(report.rows, total)
    _delete_orphans(spec, collection, dry_run, report)
    return report


def _reconcile_batch(spec, batch, only_collection, dry_run, report) -> None:
    source_ids = [spec.source_id(row.pk) for row in batch]
    stored: dict[tuple[str, str], dict] = {}
    for entry in (
        Document.objects.using(write_db())
        .filter(source_id__in=source_ids, status=Document.Status.COMPLETED)
        .order_by("version")  # the newest last: it wins below
        .values("source_id", "collection__name", "content_hash", "title", "metadata")
    ):
        stored[(entry["source_id"], entry["collection__name"])] = entry
    writes: dict[str, list[dict]] = defaultdict(list)
    touches, deletes = [], []
    for row, source_id in zip(batch, source_ids, strict=True):
        try:
            target = spec.collection_for(row)
            if only_collection is not None and target != only_collection:
                continue
            document = spec.document_for(row)
            text, format = "", spec.format
            if document["text"].strip():
                text, format = _converted(clean_text(document["text"]), spec.format)
        except (RagError, ValueError, TypeError) as exc:
            report.failed += 1
            report.errors.append(f"{source_id}: {exc}")
            continue
        elsewhere = [name for sid, name in stored if sid == source_id and name != target]
        deletes.extend((name, source_id) for name in elsewhere)
        current = stored.get((source_id, target))
        if not text:
            if current is not None:
                deletes.append((target, source_id))
            continue
        if current is None or current["content_hash"] != content_hash(text):
            if current is None:
                report.added += 1
            else:
                report.replaced += 1
            writes[target].append(
                {**document, "text": text, "source_id": source_id, "format": format}
            )
        elif current["title"] != document["title"] or current["metadata"] != document["metadata"]:
            report.updated += 1
            touches.append((target, source_id, document))
        else:
            report.unchanged += 1
    report.deleted += len(deletes)
    if dry_run:
        return
    for name, source_id in deletes:
        delete_source(name, source_id)
    for name, source_id, document in touches:
        (version,) = next_versions(1)
        touch_source(
            name, source_id, version, title=document["title"], metadata=document["metadata"]
        )
    for name, items in writes.items():
        try:
            results = ingest_many(items, collection=name, replace=True)
        except RagError as exc:  # the batch's items were validated above: rare
            report.failed += len(items)
            report.errors.append(f"{len(items)} rows for {name!r}: {exc}")
            continue
        for item, result in zip(items, results, strict=True):
            if isinstance(result, Exception):
                report.failed += 1
                report.errors.append(f"{item['source_id']}: {result}")


def _delete_orphans(spec, only_collection, dry_run, report, batch_size: int = 1000) -> None:
    """Delete the documents of rows that are gone or no longer indexed."""
    documents = Document.objects.using(write_db()).filter(source_id__startswith=f"{spec.label}:")
    if only_collection is not None:
        documents = documents.filter(collection__name=only_collection)
    last_id = 0
    while True:
        page = list(
            documents.filter(pk__gt=last_id)
            .order_by("pk")
            .values_list("pk", "source_id", "collection__name")[:batch_size]
        )
        if not page:
            break
        last_id = page[-1][0]
        pks = {spec.pk_of(source_id) for _, source_id, _ in page}
        alive = {
            str(pk) for pk in spec.rows().filter(pk__in=list(pks)).values_list("pk", flat=True)
        }
        gone = sorted(
            {(name, source_id) for _, source_id, name in page if spec.pk_of(source_id) not in alive}
        )
        report.deleted += len(gone)
        if not dry_run:
            for name, source_id in gone:
                delete_source(name, source_id)


# --- search hits back to rows ----------------------------------------------------------------


@rejects_unknown_options("with_objects()")
def with_objects(results: Sequence[SearchResult], *, user: Any = None) -> list[SearchResult]:
    """Attach to each hit of a registered model its row (``hit.object``), loading the rows of
    each model in one query. With ``user``, hits whose row the user may not see (the
    registration's ``visible(user, queryset)``) or whose row is gone are dropped; other hits
    (documents not from a model) pass through unchanged."""
    wanted: dict[str, set[str]] = defaultdict(set)
    for hit in results:
        spec = for_source(hit.source_id)
        if spec is not None:
            wanted[spec.label].add(spec.pk_of(hit.source_id))
    loaded: dict[str, dict[str, Any]] = {}
    for label, pks in wanted.items():
        spec = get(label)
        rows = spec.model._default_manager.filter(pk__in=sorted(pks))
        if user is not None and spec.visible is not None:
            rows = spec.visible(user, rows)
        loaded[label] = {str(row.pk): row for row in rows}
    kept = []
    for hit in results:
        spec = for_source(hit.source_id)
        if spec is None:
            kept.append(hit)
            continue
        hit.object = loaded[spec.label].get(spec.pk_of(hit.source_id))
        if hit.object is None and user is not None:
            continue
        kept.append(hit)
    return kept


# --- what the dashboard shows ------------------------------------------------------------------


def status() -> list[dict[str, Any]]:
    """Per registered model: rows in the indexed set, documents stored, rows missing one,
    sync jobs pending or running, and failed (since the last completed one of each row)."""
    out = []
    for spec in registered():
        documents = Document.objects.filter(source_id__startswith=f"{spec.label}:")
        rows = spec.rows().count()
        indexed = documents.filter(status=Document.Status.COMPLETED).count()
        jobs = Job.objects.filter(kind=Job.Kind.SYNC_ROW, params__model=spec.label)
        out.append(
            {
                "model": spec.label,
                "name": spec.model._meta.verbose_name_plural,
                "collection": spec.fixed_collection or "per row",
                "rows": rows,
                "indexed": indexed,
                "missing": max(rows - indexed, 0),
                "pending": jobs.filter(status__in=[Job.Status.PENDING, Job.Status.RUNNING]).count(),
                "failed": jobs.filter(status=Job.Status.FAILED).count(),
            }
        )
    return out
