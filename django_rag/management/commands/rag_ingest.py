import glob
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from django_rag.exceptions import RagError
from django_rag.ingestion.parsers import parser_registry
from django_rag.ingestion.service import ingest_file
from django_rag.management.progress import ProgressBar


def expand_paths(patterns: list[str], extensions: set[str]) -> list[Path]:
    """Files named by ``patterns``: files as given, directories walked, globs expanded."""
    found: list[Path] = []
    for pattern in patterns:
        matches = glob.glob(pattern, recursive=True) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise CommandError(f"{pattern}: no file matches this pattern")
        for match in matches:
            path = Path(match)
            if path.is_dir():
                found.extend(
                    sorted(
                        p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in extensions
                    )
                )
            else:
                found.append(path)
    unique = list(dict.fromkeys(found))
    return unique


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
        files = expand_paths(paths, set(parser_registry()))
        if source_id and len(files) != 1:
            raise CommandError(f"--source-id names one document but {len(files)} files were given")
        if not files:
            raise CommandError(
                "No files to ingest (directories are searched for supported extensions)."
            )
        progress = ProgressBar(len(files), self.stderr, enabled=not quiet)
        created = unchanged = chunks = 0
        failures: list[tuple[Path, str]] = []
        for path in files:
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
                        f"ingested {path}: {document.chunk_count} chunks (document {document.pk})"
                    )
            progress.advance(path.name)
            if not quiet:
                if progress.enabled:
                    self.stderr.write("\r", ending="")
                self.stdout.write(line)
        progress.close()
        self.stdout.write(
            f"{len(files)} file(s): {created} ingested ({chunks} chunks), {unchanged} unchanged, "
            f"{len(failures)} failed"
        )
        if failures:
            raise CommandError(
                f"{len(failures)} file(s) failed:\n"
                + "\n".join(f"  {path}: {reason}" for path, reason in failures),
                returncode=1,
            )
