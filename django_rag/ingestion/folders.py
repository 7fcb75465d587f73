"""Folders: walking a directory tree safely, and keeping a collection in step with it.

:func:`walk_folder` is what ``rag_ingest DIR`` and :func:`sync_folder` read a directory with.
It never leaves the tree it was given: a symlink whose target resolves outside the directory
is skipped and reported (``a/passwd.txt -> /etc/passwd`` is not read), and so is a symlink to
something inside it (that file or directory is read under its own path already; following the
link would read it twice, or forever when it points at an ancestor).

:func:`sync_folder` makes a collection mirror a directory (docs/sync.md, "Folders"): a file's
identity (``source_id``) is its path relative to the directory, ``/``-separated (with an
optional prefix), so moving the directory or naming it differently changes nothing. New files
are added, changed ones replace their document, unchanged ones are skipped before anything is
embedded (their parsed text's hash equals the stored document's ``content_hash``), and the
documents of files that are gone are deleted through :func:`django_rag.store.delete_source`,
which leaves a tombstone so an older write still queued cannot bring them back.
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import os
import stat
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Unpack

from django.utils import timezone

from ..exceptions import FileNotFound, InvalidOption, RagError
from ..models import Document, Job
from ..models.databases import write_db
from ..signals import span
from ..store import delete_source
from ..validation import clean_filename, clean_source_id, clean_text
from .isolation import parse_file_isolated
from .parsers import ParsedDocument, parser_registry
from .request import IngestOptions, build_ingest_request

# --- walking a tree -------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderFile:
    """A file found in a directory walk: its path (under the directory as given) and its path
    relative to the directory (``/``-separated: the default identity)."""

    path: Path
    relative: str


@dataclass(frozen=True)
class Skipped:
    """An entry a walk did not read, and why (printed by ``rag_ingest``)."""

    path: Path
    reason: str


def _inside(real: Path, root: Path) -> bool:
    return real == root or real.is_relative_to(root)


def walk_folder(directory: str | Path) -> tuple[list[FolderFile], list[Skipped]]:
    """Every file under ``directory`` (sorted, without following links out of it), and the
    entries skipped with their reasons.

    Rules: real directories are walked and their files returned; every symlink is skipped and
    reported: when its target is outside ``directory`` (resolved first, so a directory given
    through a link is fine), when it dangles or loops, and when its target is inside (that file
    or directory is read under its own path: following the link would only add a duplicate, or
    loop for an ancestor). So a walk reads each file of the tree once and nothing outside it.
    Non-regular files (FIFOs, sockets) are returned: the caller reports them without opening
    them.
    """
    top = Path(directory)
    try:
        root = top.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise FileNotFound(f"{top}: no such directory", path=str(top)) from exc
    if not root.is_dir():
        raise InvalidOption(f"{top} is not a directory; give a directory to walk or sync.")
    files: list[FolderFile] = []
    skipped: list[Skipped] = []
    pending: list[tuple[Path, tuple[str, ...]]] = [(top, ())]
    while pending:
        here, parts = pending.pop()
        try:
            with os.scandir(here) as scan:
                entries = sorted(scan, key=lambda entry: entry.name)
        except OSError as exc:
            skipped.append(Skipped(here, f"cannot be read ({exc.strerror or exc})"))
            continue
        subdirectories = []
        for entry in entries:
            path = here / entry.name
            relative = (*parts, entry.name)
            if entry.is_symlink():
                try:
                    target = path.resolve(strict=True)
                except (OSError, RuntimeError):
                    skipped.append(Skipped(path, "symlink that is dangling or loops"))
                    continue
                if not _inside(target, root):
                    skipped.append(Skipped(path, f"symlink leaving {top} (to {target})"))
                    continue
                # Inside the tree, the target is read under its own path: the link would
                # only add a duplicate (or, for an ancestor directory, a loop).
                kind = "directory" if target.is_dir() else "file"
                skipped.append(Skipped(path, f"symlink to a {kind} inside {top} (read there)"))
            elif entry.is_dir(follow_symlinks=False):
                subdirectories.append((path, relative))
            else:
                files.append(FolderFile(path, "/".join(relative)))
        pending.extend(reversed(subdirectories))  # depth first, in name order
    files.sort(key=lambda item: item.relative)
    return files, skipped


def glob_root(pattern: str) -> Path:
    """The directory a glob pattern walks: its components before the first wildcard."""
    parts = Path(pattern).parts
    literal: list[str] = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        literal.append(part)
    return Path(*literal) if literal else Path(".")


def _glob_matcher(parts: tuple[str, ...]) -> Callable[[tuple[str, ...]], bool]:
    """Whether relative path components match the pattern components ``parts`` (``*``, ``?``,
    ``[...]`` within a component, ``**`` for any number of directories, hidden names only by a
    pattern that starts with a dot, as :func:`glob.glob` does). Memoised over positions, so
    ``**/**/**`` stays polynomial."""

    def matches(path: tuple[str, ...]) -> bool:
        @functools.cache
        def at(i: int, j: int) -> bool:
            if j == len(parts):
                return i == len(path)
            if parts[j] == "**":
                if at(i, j + 1):
                    return True
                return i < len(path) and not path[i].startswith(".") and at(i + 1, j)
            if i == len(path):
                return False
            if path[i].startswith(".") and not parts[j].startswith("."):
                return False
            return fnmatch.fnmatchcase(path[i], parts[j]) and at(i + 1, j + 1)

        return at(0, 0)

    return matches


def glob_files(pattern: str) -> tuple[list[tuple[FolderFile, bool]], list[Skipped]]:
    """The files a glob pattern names, found by :func:`walk_folder` from the pattern's literal
    directory (so a ``**`` never follows a symlink out of it, nor around a loop: Python's
    :func:`glob.glob` does both), and the links skipped where the pattern could reach. A
    directory the pattern matches stands for the files under it. Each file comes with whether
    the pattern named it (not only a directory above it); its ``relative`` is its path as the
    pattern would have named it."""
    root = glob_root(pattern)
    wanted = _glob_matcher(Path(pattern).parts[len(root.parts) if str(root) != "." else 0 :])
    try:
        files, skipped = walk_folder(root)
    except RagError:
        return [], []

    def named(relative: str) -> int:
        """2: the pattern names the file; 1: a directory above it; 0: neither."""
        parts = tuple(relative.split("/"))
        if wanted(parts):
            return 2
        return int(any(wanted(parts[:end]) for end in range(1, len(parts))))

    found = []
    for item in files:
        how = named(item.relative)
        if how:
            found.append((FolderFile(item.path, str(item.path)), how == 2))
    reach = [
        item for item in skipped if "**" in pattern or named(item.path.relative_to(root).as_posix())
    ]
    return found, reach


def is_regular_file(path: Path) -> bool:
    """True for a regular file (after symlinks); a FIFO would block the read forever."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # let ingestion report the real error (missing file, permissions)


# --- keeping a collection in step with a folder ---------------------------------------------


@dataclass
class FolderSync:
    """What :func:`sync_folder` did (or, with ``dry_run``, would do). Lists hold source ids,
    sorted; ``failed`` maps a source id to the error its file raised (its stored document, if
    any, is kept); ``skipped`` holds what the walk passed over (links leaving the folder, files
    of types no parser reads, non-regular files), whose documents, if any, are deleted."""

    collection: str
    directory: str
    dry_run: bool
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: dict[str, Exception] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    documents: dict[str, Document] = field(default_factory=dict)  # added and replaced
    superseded: list[str] = field(default_factory=list)  # a newer write of the file won
    chunks: int = 0

    def counts(self) -> dict[str, int]:
        return {
            "added": len(self.added),
            "replaced": len(self.replaced),
            "unchanged": len(self.unchanged),
            "deleted": len(self.deleted),
            "failed": len(self.failed),
            "skipped": len(self.skipped),
        }


def _stored(collection: str, prefix: str) -> dict[str, list[tuple[str, str]]]:
    """(content_hash, status) of every document of the collection whose source id is under
    ``prefix`` (all with a source id when it is empty), by source id."""
    rows = (
        Document.objects.using(write_db())
        .filter(collection__name=collection)
        .exclude(source_id="")
        .filter(source_id__startswith=prefix)
        .values_list("source_id", "content_hash", "status")
    )
    stored: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for source_id, digest, status in rows.iterator(chunk_size=5000):
        stored[source_id].append((digest, status))
    return stored


def sync_folder(
    path: str | Path,
    *,
    prefix: str = "",
    dry_run: bool = False,
    record: bool = True,
    **options: Unpack[IngestOptions],
) -> FolderSync:
    """Make ``collection`` mirror the directory ``path``; return a :class:`FolderSync`.

    Each supported file is a document whose ``source_id`` is ``prefix`` + its path relative to
    ``path`` (``/``-separated). A file whose text is new is added, one whose text changed
    replaces its document (``replace=True``: older versions go in the same transaction), and one
    whose parsed text hashes to its single stored document's ``content_hash`` is left alone
    without being embedded. Documents of the collection whose source id starts with ``prefix``
    (every document with a source id when ``prefix`` is empty: the folder owns the collection)
    and that no file of the folder has any more are deleted. A file that fails to parse is
    reported in ``failed`` and its stored document is kept. Files are parsed in bounded workers
    reused from file to file (:mod:`~django_rag.ingestion.isolation`). Symlinks leaving the folder are
    skipped and reported (:func:`walk_folder`).

    ``dry_run=True`` parses and compares but writes nothing: the result says what would be
    added, replaced, left and deleted. The other options (``collection``, ``metadata``,
    ``chunker``, ``embedder``, ``chunk_size``, ``chunk_overlap``, ``graph`` and the extractors,
    ``strict_collections``, ``group_size``, ``progress``) are those of
    :func:`~django_rag.ingestion.files.ingest_files`, checked before the folder is read; every
    file replaces its document (``replace`` is not an option here).

    Each run (dry runs too) is recorded as a finished ``sync`` job with its counts, so the
    dashboard's Sync page lists the folders and can sync them again (``record=False`` for a
    run that is itself a job).
    """
    from .files import ingest_parsed_files
    from .pipeline import content_hash

    request = replace(build_ingest_request("sync_folder", options), replace=True)
    name = request.collection_name
    if not isinstance(prefix, str):
        raise InvalidOption(f"prefix must be a str, got {type(prefix).__name__}")
    if prefix:
        clean_source_id(prefix)
    root = Path(path)
    started = timezone.now()  # the recorded job's real duration
    with span("sync_folder", collection=name, directory=str(root), dry_run=dry_run) as s:
        found, skipped = walk_folder(root)
        report = FolderSync(name, str(root), dry_run, skipped=list(skipped))
        extensions = set(parser_registry())
        wanted: list[tuple[FolderFile, str, ParsedDocument]] = []
        present: set[str] = set()
        stored = _stored(name, prefix)
        for item in found:
            if item.path.suffix.lower() not in extensions:
                report.skipped.append(Skipped(item.path, "no parser for this file type"))
                continue
            if not is_regular_file(item.path):
                report.skipped.append(Skipped(item.path, "not a regular file"))
                continue
            source_id = prefix + item.relative
            try:
                source_id = clean_source_id(source_id)
                clean_filename(str(item.path))
                parsed = parse_file_isolated(item.path)
                parsed.text = clean_text(parsed.text)
            except (RagError, OSError) as exc:
                report.failed[source_id] = exc
                present.add(source_id)  # the file is there: its document stays
                continue
            present.add(source_id)
            versions = stored.get(source_id, [])
            digest = content_hash(parsed.text)
            if versions == [(digest, Document.Status.COMPLETED)]:
                report.unchanged.append(source_id)
                continue
            (report.replaced if versions else report.added).append(source_id)
            wanted.append((item, source_id, parsed))
        report.deleted = sorted(source for source in stored if source not in present)
        s.set(**report.counts())
        if dry_run:
            if record:
                _record(report, prefix, started)
            return report
        if wanted:
            outcomes = ingest_parsed_files(
                [item.path for item, _, _ in wanted],
                [parsed for _, _, parsed in wanted],
                request,
                source_ids=[source_id for _, source_id, _ in wanted],
            )
            for (_, source_id, _), outcome in zip(wanted, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    report.failed[source_id] = outcome
                    continue
                if getattr(outcome, "superseded", False):
                    report.superseded.append(source_id)
                report.documents[source_id] = outcome
                report.chunks += outcome.chunk_count
            failed = set(report.failed)
            report.added = [source for source in report.added if source not in failed]
            report.replaced = [source for source in report.replaced if source not in failed]
        for source_id in report.deleted:
            delete_source(name, source_id)
        s.set(**report.counts())
        if record:
            _record(report, prefix, started)
        return report


def _record(report: FolderSync, prefix: str, started) -> None:
    """A run outside a job (``rag_ingest --sync``, ``sync_folder``) as a finished ``sync`` job
    with its real start and end, so the dashboard shows how long it took."""
    job = Job.objects.create(
        kind=Job.Kind.SYNC,
        status=Job.Status.COMPLETED,
        params=folder_params(report.directory, report.collection, prefix, report.dry_run),
        result=report.counts(),
        started_at=started,
        finished_at=timezone.now(),
        done=sum(report.counts().values()),
    )
    # Queued when it started (auto_now_add set the end), so it never reads as started first.
    Job.objects.filter(pk=job.pk).update(created_at=started)


def folder_params(directory: str, collection: str, prefix: str, dry_run: bool) -> dict:
    """How a folder sync is named in a job's params (the dashboard groups runs by them)."""
    return {
        "folder": str(Path(directory).resolve()),
        "collection": collection,
        "prefix": prefix,
        "dry_run": bool(dry_run),
        "title": str(Path(directory).resolve()),
    }
