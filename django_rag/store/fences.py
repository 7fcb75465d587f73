"""Identities, their locks and version fences: the rules that make the newest submitted version of
an identity win, whatever order its writes run in (docs/architecture.md, "The newest version
wins").

Each document takes a version from a sequence when it is submitted (:func:`next_versions`); a
replace or a delete records its version in the identity's :class:`SourceVersion` row, which only
moves forward, and a write older than that row is superseded. Writers of one identity are
serialised by an advisory lock (:func:`lock_identity`, :func:`lock_identities` for a batch, in
key order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connections, transaction

from ..exceptions import DocumentSuperseded
from ..models import Collection, Document, SourceVersion
from ..models.databases import write_db
from ..models.documents import VERSION_SEQUENCE
from .transactions import retry_transient


def lock_identity(collection: str, source_id: str, content_hash: str) -> None:
    """Serialise writers of one (collection, source) identity until the transaction ends:
    replace and dedup decide on committed state, so concurrent replaces end with one document."""
    identity = source_id or f"#{content_hash}"
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"django_rag:document:{collection}:{identity}"],
        )


def next_versions(count: int) -> list[int]:
    """``count`` new document versions, ascending, in one statement. Taken when a document is
    submitted (before it is embedded or queued), so versions follow the order of the calls."""
    if count <= 0:
        return []
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            "SELECT nextval(%s::regclass) FROM generate_series(1, %s)", [VERSION_SEQUENCE, count]
        )
        return [row[0] for row in cursor.fetchall()]


def _has_version(document: Document) -> bool:
    return isinstance(document.version, int)


def ensure_versions(documents: Sequence[Document]) -> None:
    missing = [document for document in documents if not _has_version(document)]
    for document, version in zip(missing, next_versions(len(missing)), strict=True):
        document.version = version


def source_fences(collection: Collection, source_ids: Sequence[str]) -> dict[str, int]:
    """The identities' :class:`SourceVersion` (the newest replace or delete written)."""
    wanted = sorted({source for source in source_ids if source})
    if not wanted:
        return {}
    return dict(
        SourceVersion.objects.using(write_db())
        .filter(collection=collection, source_id__in=wanted)
        .values_list("source_id", "version")
    )


def raise_fences(collection: Collection, versions: dict[str, int], *, deleted: bool) -> None:
    """Record that ``versions`` (source_id -> version) replaced (or deleted) their identities;
    a fence only ever moves forward."""
    if not versions:
        return
    sources = sorted(versions)
    table = SourceVersion._meta.db_table
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} AS f (collection_id, source_id, version, deleted, updated_at)
            SELECT %s, s, v, %s, now() FROM unnest(%s::text[], %s::bigint[]) AS u (s, v)
            ON CONFLICT (collection_id, source_id) DO UPDATE
            SET version = EXCLUDED.version, deleted = EXCLUDED.deleted, updated_at = now()
            WHERE f.version < EXCLUDED.version
            """,
            [collection.pk, deleted, sources, [versions[source] for source in sources]],
        )


def older_versions(collection: Collection, versions: dict[str, int], keep: set[int]) -> list[int]:
    """Ids of the documents of each identity older than its version in ``versions``."""
    if not versions:
        return []
    rows = (
        Document.objects.using(write_db())
        .filter(collection=collection, source_id__in=sorted(versions))
        .values_list("pk", "source_id", "version")
    )
    return sorted(
        pk for pk, source, version in rows if version < versions[source] and pk not in keep
    )


@dataclass
class SupersededWrite:
    """What a write returns from inside its transaction when it came too late (raised as
    :class:`DocumentSuperseded` once the transaction has committed the pending row's removal)."""

    collection: str
    source_id: str
    version: int
    newer: int

    def error(self) -> DocumentSuperseded:
        return DocumentSuperseded(self.collection, self.source_id, self.version, self.newer)


def identity_key(collection: str, source_id: str, content_hash: str) -> str:
    """The advisory-lock key of a (collection, source) identity (content hash without source)."""
    return f"django_rag:document:{collection}:{source_id or '#' + content_hash}"


def lock_identities(collection: str, identities: Sequence[tuple[str, str]]) -> None:
    """:func:`lock_identity` for many (source_id, content_hash) pairs, in one statement and in
    the order of the lock keys, so two batches sharing identities cannot deadlock."""
    keys = sorted({identity_key(collection, source, digest) for source, digest in identities})
    with connections[write_db()].cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(k)) FROM ("
            "SELECT DISTINCT hashtextextended(key, 0) AS k FROM unnest(%s::text[]) AS key "
            "ORDER BY 1) AS keys",
            [keys],
        )


def touch_source(
    collection: str,
    source_id: str,
    version: int,
    *,
    title: str | None = None,
    metadata: dict | None = None,
) -> Document | None:
    """Record that ``version`` of ``(collection, source_id)`` found its stored document current
    (same text), so an older write still running for the source is superseded; ``title`` and
    ``metadata``, when given, update that document in place (no re-embedding). Returns the
    document, or None when none is stored or a newer version got there first."""
    db = write_db()

    def write() -> Document | None:
        with transaction.atomic(using=db):
            lock_identity(collection, source_id, "")
            row = Collection.objects.using(db).filter(name=collection).first()
            if row is None or source_fences(row, [source_id]).get(source_id, 0) > version:
                return None
            raise_fences(row, {source_id: version}, deleted=False)
            document = (
                Document.objects.using(db)
                .filter(collection=row, source_id=source_id, status=Document.Status.COMPLETED)
                .order_by("-version")
                .first()
            )
            changes = {
                field: value
                for field, value in (("title", title), ("metadata", metadata))
                if value is not None and getattr(document, field, value) != value
            }
            if document is not None and changes:
                for field, value in changes.items():
                    setattr(document, field, value)
                document.save(using=db, update_fields=[*changes, "updated_at"])
            return document

    return retry_transient(write, what="touch_source")
