from django.core.management.base import CommandError

from django_rag import maintenance
from django_rag.exceptions import RagError
from django_rag.ingestion.headers import headers_enabled
from django_rag.management.progress import RagCommand


class Command(RagCommand):
    help = (
        "Maintenance: `orphans` finds (and with --apply removes) inconsistent rows; `jobs` "
        "counts (and with --apply deletes) finished jobs older than --days; `headers` finds "
        "(and with --apply rebuilds, re-indexes and re-embeds) chunks whose header does not "
        "match CHUNK_HEADERS; `vector-index` compares the HNSW index with VECTOR_INDEX_TYPE "
        "(and with --apply rebuilds it of that type); `fulltext-index` compares the rows the "
        "pg_textsearch BM25 index counts with the chunks (and with --apply rebuilds it)."
    )

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        orphans = actions.add_parser("orphans", help="chunks without a consistent parent")
        orphans.add_argument("--apply", action="store_true", help="remove them (default: dry run)")
        jobs = actions.add_parser("jobs", help="finished jobs older than --days")
        jobs.add_argument("--days", type=float, default=30, help="age in days (default 30)")
        jobs.add_argument("--apply", action="store_true", help="delete them (default: dry run)")
        headers = actions.add_parser(
            "headers", help="chunks whose header does not match CHUNK_HEADERS (set it or not)"
        )
        headers.add_argument("--collection", help="only this collection")
        headers.add_argument("--apply", action="store_true", help="rebuild them (default: dry run)")
        index = actions.add_parser(
            "vector-index", help="the HNSW index against VECTOR_INDEX_TYPE ('vector'/'halfvec')"
        )
        index.add_argument(
            "--apply", action="store_true", help="rebuild it when it differs (default: dry run)"
        )

        fulltext = actions.add_parser(
            "fulltext-index",
            help="the rows the pg_textsearch BM25 index counts against the chunks",
        )
        fulltext.add_argument(
            "--apply", action="store_true", help="rebuild it when they differ (default: dry run)"
        )

    def handle(self, *args, action, **options):
        if action == "fulltext-index":
            self._fulltext_index(options["apply"])
            return
        if action == "vector-index":
            self._vector_index(options["apply"])
            return
        if action == "headers":
            self._headers(options["collection"], options["apply"])
            return
        if action == "jobs":
            found = maintenance.prune_jobs(older_than_days=options["days"], apply=options["apply"])
            verb = "Deleted" if options["apply"] else "Found"
            for kind, count in found.items():
                self.stdout.write(f"{verb} {count} finished {kind} job(s)")
            if not found:
                self.stdout.write(f"No finished job older than {options['days']:g} days.")
            elif not options["apply"]:
                self.stdout.write("Dry run: nothing was deleted. Run again with --apply.")
            return
        try:
            if options["apply"]:
                found = maintenance.remove_orphans()
                verb = "Removed"
            else:
                found = maintenance.find_orphans()
                verb = "Found"
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        for name, count in found.items():
            self.stdout.write(f"{verb} {count} {name.replace('_', ' ')}")
        if not options["apply"] and any(found.values()):
            self.stdout.write(
                "Dry run: nothing was changed. Run again with --apply to remove them."
            )

    def _headers(self, collection, apply):
        try:
            found = maintenance.refresh_headers(collection=collection, apply=apply)
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        verb = "Rebuilt" if apply else "Found"
        self.stdout.write(
            f"{verb} {found['chunks']} chunk header(s) in {found['documents']} document(s) "
            f"{'now matching' if apply else 'not matching'} CHUNK_HEADERS "
            f"({'on' if headers_enabled() else 'off'})."
        )
        if found["chunks"] and not apply:
            self.stdout.write(
                "Dry run: nothing was changed. Run again with --apply to rebuild, re-index and "
                "re-embed them."
            )

    def _vector_index(self, apply):
        try:
            state = maintenance.vector_index(apply=apply)
        except (RagError, LookupError) as exc:
            raise CommandError(str(exc)) from exc
        found = state["index"] or "missing"
        if state["rebuilt"]:
            self.stdout.write(
                f"Rebuilt the HNSW index as {found} (VECTOR_INDEX_TYPE={state['configured']!r})."
            )
        elif state["matches"]:
            self.stdout.write(
                f"The HNSW index is {found}, as VECTOR_INDEX_TYPE={state['configured']!r} asks."
            )
        else:
            self.stdout.write(
                f"The HNSW index is {found} but VECTOR_INDEX_TYPE={state['configured']!r}. Dry "
                "run: nothing was changed. Run again with --apply to rebuild it (built "
                "concurrently: searches and writes go on meanwhile)."
            )

    def _fulltext_index(self, apply):
        try:
            state = maintenance.fulltext_index(apply=apply)
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        chunks = f"{state['chunks']:,} chunk(s)"
        if state["backend"] == "sql":
            self.stdout.write(
                "Full-text search runs on the SQL backend: its statistics count the "
                f"{chunks} at every commit. Nothing to rebuild."
            )
            return
        counted = "an unknown number of" if state["counted"] is None else f"{state['counted']:,}"
        if state["rebuilt"]:
            self.stdout.write(f"Rebuilt the BM25 index: it now counts {counted} rows for {chunks}.")
        elif not state["stale"]:
            self.stdout.write(f"The BM25 index counts {counted} rows for {chunks}: nothing to do.")
        else:
            self.stdout.write(
                f"The BM25 index counts {counted} rows for {chunks}: rolled-back inserts, "
                "deleted chunks and the old versions of updated ones skew its statistics "
                "(document frequencies, average length), so full-text and hybrid scores drift. "
                "Dry run: nothing was changed. Run again with --apply to rebuild it (REINDEX: "
                "writes to the chunk table wait while it runs, 1.7 s for 13k chunks here)."
            )
