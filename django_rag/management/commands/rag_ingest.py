import glob
import os
import stat
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from django_rag.exceptions import RagError
from django_rag.ingestion.parsers import parser_registry
from django_rag.ingestion.service import ingest_file
from django_rag.management.progress import ProgressBar


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


class Command(BaseCommand):
    help = "Ingest files (text, Markdown, PDF): paths, directories (walked) or glob patterns."

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", metavar="PATH")
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
            "--replace",
            action="store_true",
            help="replace the stored document with the same source id",
        )
        parser.add_argument("--quiet", action="store_true", help="print only the summary")

    def handle(self, *args, paths, collection, source_id, replace, quiet, **options):
        files, unsupported = expand_paths(paths, set(parser_registry()))
        if source_id and len(files) != 1:
            raise CommandError(f"--source-id names one document but {len(files)} files were given")
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
        if not quiet and verbosity >= 2:
            for path in unsupported:
                self.stdout.write(f"skipped {path}: no parser for this file type")
        progress = ProgressBar(len(files), self.stderr, enabled=not quiet)
        created = unchanged = chunks = skipped = 0
        failures: list[tuple[Path, str]] = []
        for path in files:
            # One file's failure is reported once, here, and the batch goes on.
            if not is_regular_file(path):
                skipped += 1
                line = f"skipped {path}: not a regular file"
            else:
                try:
                    document = ingest_file(
                        path,
                        collection=collection,
                        source_id=source_id or str(path),
                        replace=replace,
                    )
                except (RagError, OSError) as exc:
                    failures.append((path, f"{type(exc).__name__}: {exc}"))
                    line = self.style.ERROR(f"FAILED {path}: {exc}")
                else:
                    if document.deduplicated:
                        unchanged += 1
                        line = f"unchanged {path}"
                    else:
                        created += 1
                        chunks += document.chunk_count
                        line = (
                            f"ingested {path}: {document.chunk_count} chunks "
                            f"(document {document.pk})"
                        )
            progress.advance(path.name)
            if not quiet:
                if progress.enabled:
                    self.stderr.write("\r", ending="")
                self.stdout.write(line)
        progress.close()
        summary = (
            f"{len(files)} file(s): {created} ingested ({chunks} chunks), {unchanged} unchanged, "
            f"{len(failures)} failed"
        )
        if skipped:
            summary += f", {skipped} skipped (not a regular file)"
        if unsupported:
            summary += (
                f"; {len(unsupported)} other file(s) in the directories skipped "
                "(no parser for their type"
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
