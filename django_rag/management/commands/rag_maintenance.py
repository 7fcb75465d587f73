from django.core.management.base import CommandError

from django_rag import maintenance
from django_rag.exceptions import RagError
from django_rag.management.progress import RagCommand


class Command(RagCommand):
    help = "Maintenance: `orphans` finds (and with --apply removes) inconsistent rows."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        orphans = actions.add_parser("orphans", help="chunks without a consistent parent")
        orphans.add_argument("--apply", action="store_true", help="remove them (default: dry run)")

    def handle(self, *args, action, **options):

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
