import glob
import json
import os
import stat
import threading
from collections import Counter
from pathlib import Path

from django.core.management.base import CommandError

from django_rag.exceptions import RagError
from django_rag.ingestion.parsers import parser_registry
from django_rag.ingestion.service import ingest_files
from django_rag.management.progress import ProgressBar, RagCommand
from django_rag.validation import clean_metadata


def expand_paths(patterns: list[str], extensions: set[str]) -> tuple[list[Path], list[Path]]:
    """Files named by ``patterns``: files as given, directories walked, globs expanded.

    Returns the files to ingest and the files a directory walk passed over because no parser
    handles their extension. Paths named explicitly (or by a glob) are always kept: an
    unsupported one fails with a message naming the supported types.
    """
    found: list[Path] = []
    unsupported: list[Path] = []
    for pattern in patterns:
        matches = glob.glob(pattern, recursive=True) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise CommandError(f"{pattern}: no file matches this pattern")
        for match in matches:
            path = Path(match)
            if path.is_dir():
                for entry in sorted(path.rglob("*")):
                    if entry.is_dir() or not entry.exists():  # (a dangling symlink)
                        continue
                    # Non-regular entries (FIFOs...) are kept, to be reported as skipped.
                    (found if entry.suffix.lower() in extensions else unsupported).append(entry)
            else:
                found.append(path)
    return list(dict.fromkeys(found)), list(dict.fromkeys(unsupported))


def is_regular_file(path: Path) -> bool:
    """True for a regular file (after symlinks); a FIFO would block the read forever."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # let ingestion report the real error (missing file, permissions)


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
        "Files are embedded in batches and written a group at a time."
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
            help="document identity; only with a single file (default: the path)",
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
            "--replace",
            action="store_true",
            help="replace the stored document with the same source id",
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
        replace,
        quiet,
        **options,
    ):
        metadata = parse_metadata(metadata)
        files, unsupported = expand_paths(paths, set(parser_registry()))
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
            )
        verbosity = options.get("verbosity", 1)
        regular, irregular = [], []
        for path in files:
            (regular if is_regular_file(path) else irregular).append(path)
        progress = ProgressBar(1, self.stderr, enabled=not quiet)
        lock = threading.Lock()

        def report(done: int, total: int) -> None:
            with lock:  # called from the embedding thread
                progress(done, total, "chunks embedded")

        try:
            outcomes = ingest_files(
                regular,
                collection=collection,
                source_ids=[source_id or str(path) for path in regular],
                replace=replace,
                title=title or "",
                metadata=metadata,
                chunk_size=chunk_size,
                chunk_overlap=chunk_overlap,
                progress=report if progress.enabled else None,
            )
        except RagError as exc:  # an option wrong for every file
            raise CommandError(str(exc)) from exc
        finally:
            with lock:
                progress.close()
        created = unchanged = chunks = 0
        failures: list[tuple[Path, str]] = []
        lines = {path: f"skipped {path}: not a regular file" for path in irregular}
        for path, outcome in zip(regular, outcomes, strict=True):
            if isinstance(outcome, Exception):
                # One file's failure is reported once, here, and the others went on.
                failures.append((path, f"{type(outcome).__name__}: {outcome}"))
                lines[path] = self.style.ERROR(f"FAILED {path}: {outcome}")
            elif outcome.deduplicated:
                unchanged += 1
                lines[path] = f"unchanged {path}"
            else:
                created += 1
                chunks += outcome.chunk_count
                lines[path] = (
                    f"ingested {path}: {outcome.chunk_count} chunks (document {outcome.pk})"
                )
        if not quiet:
            for path in files:
                self.stdout.write(lines[path])
            if verbosity >= 2:
                for path in unsupported:
                    self.stdout.write(f"skipped {path}: no parser for this file type")
        summary = (
            f"{len(files)} file(s): {created} ingested ({chunks} chunks), {unchanged} unchanged, "
            f"{len(failures)} failed"
        )
        if irregular:
            summary += f", {len(irregular)} skipped (not a regular file)"
        if unsupported:
            summary += (
                f"; {len(unsupported)} other file(s) in the directories skipped "
                f"(no parser for their type: {by_extension(unsupported)}"
                + (")" if verbosity >= 2 and not quiet else "; -v 2 lists them)")
            )
        self.stdout.write(summary)
        if failures:
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
