import json

from django.core.management.base import CommandError

from django_rag import sync
from django_rag.exceptions import RagError
from django_rag.management.progress import ProgressBar, RagCommand
from django_rag.validation import positive_int_arg


class Command(RagCommand):
    help = (
        "Reconcile the documents of indexed models (@django_rag.indexed) with their rows: add "
        "missing rows, replace changed ones, delete documents whose row is gone or no longer "
        "indexed. Catches what signals cannot see (QuerySet.update(), bulk_create, raw SQL, "
        "other programs). Safe to stop and run again: unchanged rows are neither embedded nor "
        "written."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "models", nargs="*", metavar="app_label.Model", help="only these models (default all)"
        )
        parser.add_argument("--collection", help="only the rows indexed in this collection")
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would change, write nothing"
        )
        parser.add_argument("--batch-size", type=positive_int_arg, default=500)
        parser.add_argument("--json", action="store_true", help="print the reports as JSON")

    def handle(self, *args, **options):
        try:
            models = options["models"] or [spec.label for spec in sync.registered()]
            if not models:
                raise CommandError(
                    "No model is indexed: register one with @django_rag.indexed(text=...) "
                    "(docs/sync.md)."
                )
            reports = []
            for model in models:
                bar = ProgressBar(1, self.stderr, enabled=not options["json"])
                reports += sync.reconcile(
                    model,
                    collection=options["collection"],
                    dry_run=options["dry_run"],
                    batch_size=options["batch_size"],
                    progress=lambda done, total, bar=bar, model=model: bar(done, total, model),
                )
                bar.close()
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps([report.to_dict() for report in reports], indent=2))
            return
        verb = "would be" if options["dry_run"] else ""
        for report in reports:
            self.stdout.write(
                f"{report.model}: {report.rows} rows; {report.added} added, {report.replaced} "
                f"replaced, {report.updated} updated, {report.deleted} deleted, "
                f"{report.unchanged} unchanged, {report.failed} failed"
                + (" (dry run: nothing written)" if verb else "")
            )
            for error in report.errors[:20]:
                self.stderr.write(f"  {error}")
        if any(report.failed for report in reports):
            raise CommandError("Some rows could not be indexed (above); fix them and run again.")
