import argparse
import glob
import json
import threading
from collections import Counter
from pathlib import Path

from django.core.management.base import CommandError

from django_rag.exceptions import RagError
from django_rag.ingestion.folders import (
    Skipped,
    glob_files,
    is_regular_file,
    sync_folder,
    walk_folder,
)
from django_rag.ingestion.parsers import parser_registry
from django_rag.ingestion.service import ingest_files
from django_rag.management.progress import ProgressBar, RagCommand
from django_rag.utils import plural
from django_rag.validation import clean_metadata


def expand_paths(
    patterns: list[str], extensions: set[str]
) -> tuple[list[tuple[Path, str]], list[Path], list[Skipped]]:
    """Files named by ``patterns``: files as given, directories walked, globs expanded.

    Returns the files to ingest with their identity (a file or glob match: its path as given;
    a file found in a directory: its path relative to that directory, as ``rag_ingest DIR
    --sync`` names it), the files a directory walk passed over because no parser handles their
    extension, and the entries skipped because they lead out of the tree being read (symlinks
    to files or directories outside a walked directory or a glob's directory, loops). Paths
    named explicitly (or by a glob) are otherwise kept: an unsupported one fails with a message
    naming the supported types. A file reached twice (a directory and a glob) is kept once.
    """
    found: list[tuple[Path, str]] = []
    unsupported: list[Path] = []
    skipped: list[Skipped] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches, passed = glob_files(pattern)
            if not matches and not passed:
                raise CommandError(f"{pattern}: no file matches this pattern")
            skipped.extend(passed)
            for item, named in matches:
                if named or item.path.suffix.lower() in extensions:
                    found.append((item.path, item.relative))
                else:  # found under a directory the pattern matched
                    unsupported.append(item.path)
            continue
        path = Path(pattern)
        if path.is_dir():
            try:
                files, passed = walk_folder(path)
            except RagError as exc:
                raise CommandError(str(exc)) from exc
            skipped.extend(passed)
            for item in files:
                if item.path.suffix.lower() in extensions:
                    found.append((item.path, item.relative))
                else:
                    unsupported.append(item.path)
        elif path.exists() or not path.is_symlink():
            found.append((path, pattern))
        else:
            skipped.append(Skipped(path, "symlink that is dangling or loops"))
    # The same file reached twice (a directory and a glob over it) is ingested once.
    seen: set[Path] = set()
    unique = []
    for path, identity in found:
        key = path.resolve() if path.exists() else path
        if key not in seen:
            seen.add(key)
            unique.append((path, identity))
    return unique, list(dict.fromkeys(unsupported)), skipped


def parse_metadata(value: str | None) -> dict | None:
    """``--metadata``: a JSON object, checked as ``ingest`` checks metadata."""
    if value is None:
        return None
    try:
        metadata = json.loads(value)
    except json.JSONDecodeError as exc:
        raise CommandError(
            f"--metadata is not valid JSON ({exc.msg} at character {exc.pos}); "
            """give an object, e.g. --metadata '{"team": "support"}'"""
        ) from exc
    if not isinstance(metadata, dict):
        raise CommandError(
            f"--metadata must be a JSON object, got {type(metadata).__name__}; "
            """e.g. --metadata '{"team": "support"}'"""
        )
    try:
        return clean_metadata(metadata)
    except RagError as exc:
        raise CommandError(f"--metadata: {exc}") from exc


def by_extension(paths: list[Path]) -> str:
    counts = Counter(path.suffix.lower() or "(no extension)" for path in paths)
    return ", ".join(f"{count} {suffix}" for suffix, count in sorted(counts.items()))


class Command(RagCommand):
    help = (
        "Ingest files (text, Markdown, PDF): paths, directories (walked) or glob patterns. "
        "A file already stored under its path with other text is replaced (--keep-versions "
        "keeps both); --sync makes the collection mirror one directory (deletes the documents "
        "of files that are gone). Files are embedded in batches and written a group at a time."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "paths",
            nargs="+",
            metavar="PATH",
            help="a file, a directory (walked) or a glob pattern",
        )
        parser.add_argument(
            "--collection",
            default=None,
            help="collection name (default: the DEFAULT_COLLECTION setting)",
        )
        parser.add_argument(
            "--source-id",
            default=None,
            help="document identity; only with a single file (default: the path as given, or "
            "relative to the directory walked)",
        )
        parser.add_argument(
            "--title",
            default=None,
            help="document title; only with a single file (default: from the file)",
        )
        parser.add_argument(
            "--metadata",
            default=None,
            metavar="JSON",
            help="""metadata for every document, a JSON object, e.g. '{"team": "support"}'""",
        )
        parser.add_argument(
            "--chunk-size",
            type=int,
            default=None,
            metavar="TOKENS",
            help="chunk size in tokens (default: the CHUNKER setting)",
        )
        parser.add_argument(
            "--chunk-overlap",
            type=int,
            default=None,
            metavar="TOKENS",
            help="tokens shared by consecutive chunks (default: the CHUNKER setting)",
        )
        parser.add_argument(
            "--strict-collections",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="never create the collection: an unknown one fails before any file is read "
            "(default: the STRICT_COLLECTIONS setting)",
        )
        versions = parser.add_mutually_exclusive_group()
        versions.add_argument(
            "--replace",
            action="store_true",
            help="replace the stored document with the same source id (the default; kept for "
            "older scripts)",
        )
        versions.add_argument(
            "--keep-versions",
            action="store_true",
            help="keep the documents stored under a file's source id and add the new text "
            "beside them (search then finds both)",
        )
        parser.add_argument(
            "--sync",
            action="store_true",
            help="make the collection mirror one DIRECTORY: add new files, replace changed "
            "ones, skip unchanged ones (not embedded again), delete the documents of files "
            "that are gone",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="with --sync: list what would be added, replaced, left and deleted; write nothing",
        )
        parser.add_argument(
            "--source-prefix",
            default="",
            metavar="PREFIX",
            help="with --sync: source ids are PREFIX + the relative path, and only documents "
            "whose source id starts with PREFIX are deleted (several folders in one "
            "collection; default: the folder owns the collection)",
        )
        parser.add_argument("--quiet", action="store_true", help="print only the summary")

    def handle(
        self,
        *args,
        paths,
        collection,
        source_id,
        title,
        metadata,
        chunk_size,
        chunk_overlap,
        strict_collections,
        replace,
        keep_versions,
        sync,
        dry_run,
        source_prefix,
        quiet,
        **options,
    ):
        # The ingest options the flags give, checked by the ingest request (ingestion.request).
        ingest_options = {
            "collection": collection,
            "metadata": parse_metadata(metadata),
            "chunk_size": chunk_size,
            "chunk_overlap": chunk_overlap,
            "strict_collections": strict_collections,
        }
        if sync:
            return self.sync(
                paths,
                ingest_options,
                source_id=source_id,
                title=title,
                keep_versions=keep_versions,
                dry_run=dry_run,
                prefix=source_prefix,
                quiet=quiet,
                verbosity=options.get("verbosity", 1),
            )
        for flag, value in (("--dry-run", dry_run), ("--source-prefix", source_prefix)):
            if value:
                raise CommandError(f"{flag} goes with --sync DIRECTORY")
        files, unsupported, outside = expand_paths(paths, set(parser_registry()))
        for flag, value in (("--source-id", source_id), ("--title", title)):
            if value and len(files) != 1:
                raise CommandError(f"{flag} names one document but {len(files)} files were given")
        if not files:
            raise CommandError(
                "No files to ingest (directories are searched for supported extensions"
                + (
                    f"; {len(unsupported)} file(s) of other types were found)."
                    if unsupported
                    else ")."
                )
                + "".join(f"\nskipped {item.path}: {item.reason}" for item in outside)
            )
        replace = not keep_versions
        identities = [source_id or identity for _, identity in files]
        if replace:
            self.refuse_shared_identities(files, identities)
        verbosity = options.get("verbosity", 1)
        regular, irregular = [], []
        for (path, _), identity in zip(files, identities, strict=True):
            (regular if is_regular_file(path) else irregular).append((path, identity))
        progress = ProgressBar(1, self.stderr, enabled=not quiet)
        lock = threading.Lock()

        def report(done: int, total: int) -> None:
            with lock:  # called from the embedding thread
                progress(done, total, "chunks embedded")

        try:
            outcomes = ingest_files(
                [path for path, _ in regular],
                source_ids=[identity for _, identity in regular],
                replace=replace,
                title=title or "",
                progress=report if progress.enabled else None,
                **ingest_options,
            )
        except RagError as exc:  # an option wrong for every file
            raise CommandError(str(exc)) from exc
        finally:
            with lock:
                progress.close()
        created = unchanged = chunks = 0
        failures: list[tuple[Path, str]] = []
        lines = {path: f"skipped {path}: not a regular file" for path, _ in irregular}
        for (path, _), outcome in zip(regular, outcomes, strict=True):
            if isinstance(outcome, Exception):
                # One file's failure is reported once, here, and the others went on.
                failures.append((path, f"{type(outcome).__name__}: {outcome}"))
                lines[path] = self.style.ERROR(f"FAILED {path}: {outcome}")
            elif outcome.superseded:  # another run wrote a newer version of this file first
                unchanged += 1
                lines[path] = f"unchanged {path}: a newer version was written meanwhile"
            elif outcome.deduplicated:
                unchanged += 1
                lines[path] = f"unchanged {path}"
            else:
                created += 1
                chunks += outcome.chunk_count
                lines[path] = (
                    f"ingested {path}: {plural(outcome.chunk_count, 'chunk')} (document {outcome.pk})"
                )
        if not quiet:
            for path, _ in files:
                self.stdout.write(lines[path])
            for item in outside:
                self.stdout.write(f"skipped {item.path}: {item.reason}")
            if verbosity >= 2:
                for path in unsupported:
                    self.stdout.write(f"skipped {path}: no parser for this file type")
        summary = (
            f"{len(files)} file(s): {created} ingested ({plural(chunks, 'chunk')}), {unchanged} unchanged, "
            f"{len(failures)} failed"
        )
        if irregular:
            summary += f", {len(irregular)} skipped (not a regular file)"
        if outside:
            summary += f", {len(outside)} link(s) skipped (leading out of the tree or looping)"
        if unsupported:
            summary += (
                f"; {len(unsupported)} other file(s) in the directories skipped "
                f"(no parser for their type: {by_extension(unsupported)}"
                + (")" if verbosity >= 2 and not quiet else "; -v 2 lists them)")
            )
        self.stdout.write(summary)
        self.raise_failures(failures, quiet)

    def refuse_shared_identities(self, files, identities) -> None:
        """Two different files under one source id would replace each other: refuse before
        anything is read (``rag_ingest a/ b/`` where both hold ``README.md``)."""
        by_identity: dict[str, list[Path]] = {}
        for (path, _), identity in zip(files, identities, strict=True):
            by_identity.setdefault(identity, []).append(path)
        shared = {key: paths for key, paths in by_identity.items() if len(paths) > 1}
        if shared:
            listed = "\n".join(
                f"  {key!r}: {', '.join(map(str, paths))}" for key, paths in sorted(shared.items())
            )
            raise CommandError(
                f"{len(shared)} source id(s) name more than one file, so each would replace "
                f"the other:\n{listed}\nIngest those directories into different collections "
                "(or with --sync --source-prefix), or pass --keep-versions to store both."
            )

    def raise_failures(self, failures: list[tuple[Path | str, str]], quiet: bool) -> None:
        if not failures:
            return
        # Without --quiet every reason was printed above; the error only names the files.
        listed = (
            (f"  {path}: {reason}" for path, reason in failures)
            if quiet
            else (f"  {path}" for path, _ in failures)
        )
        raise CommandError(
            f"{len(failures)} file(s) failed"
            + (":\n" if quiet else " (reasons above):\n")
            + "\n".join(listed),
            returncode=1,
        )

    def sync(
        self,
        paths,
        ingest_options,
        *,
        source_id,
        title,
        keep_versions,
        dry_run,
        prefix,
        quiet,
        verbosity,
    ):
        if len(paths) != 1 or not Path(paths[0]).is_dir():
            raise CommandError(
                f"--sync takes one DIRECTORY (the collection mirrors it); got {', '.join(paths)}"
            )
        for flag, value in (
            ("--source-id", source_id),
            ("--title", title),
            ("--keep-versions", keep_versions),
        ):
            if value:
                raise CommandError(
                    f"{flag} does not go with --sync (each file's identity is its path "
                    "relative to the directory, and a changed file replaces its document)"
                )
        progress = ProgressBar(1, self.stderr, enabled=not quiet and not dry_run)
        lock = threading.Lock()

        def report(done: int, total: int) -> None:
            with lock:
                progress(done, total, "chunks embedded")

        try:
            result = sync_folder(
                paths[0],
                prefix=prefix,
                dry_run=dry_run,
                progress=report if progress.enabled else None,
                **ingest_options,
            )
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            with lock:
                progress.close()
        would = "would " if dry_run else ""
        if not quiet:
            lines = [
                *(f"{would}add {source}" for source in result.added),
                *(f"{would}replace {source}" for source in result.replaced),
                *(f"unchanged {source}" for source in result.unchanged),
                *(f"{would}delete {source}" for source in result.deleted),
            ]
            for line in sorted(lines, key=lambda line: line.rsplit(" ", 1)[-1]):
                self.stdout.write(line)
            for source, error in sorted(result.failed.items()):
                self.stdout.write(self.style.ERROR(f"FAILED {source}: {error}"))
            for item in result.skipped:
                if verbosity >= 2 or item.reason != "no parser for this file type":
                    self.stdout.write(f"skipped {item.path}: {item.reason}")
        counts = result.counts()
        self.stdout.write(
            ("Dry run, nothing written: " if dry_run else "")
            + f"{result.directory} -> collection {result.collection!r}: "
            + ", ".join(
                f"{counts[key]} {would if key not in ('unchanged', 'failed', 'skipped') else ''}"
                f"{verb}"
                for key, verb in (
                    ("added", "added" if not dry_run else "add"),
                    ("replaced", "replaced" if not dry_run else "replace"),
                    ("unchanged", "unchanged"),
                    ("deleted", "deleted" if not dry_run else "delete"),
                    ("failed", "failed"),
                    ("skipped", "skipped"),
                )
            )
            + (f" ({plural(result.chunks, 'chunk')})" if not dry_run else "")
        )
        self.raise_failures(
            [(source, f"{type(e).__name__}: {e}") for source, e in sorted(result.failed.items())],
            quiet,
        )
