from django.core.management.base import CommandError

from django_rag import background, maintenance
from django_rag.exceptions import RagError
from django_rag.management.progress import ProgressBar, RagCommand
from django_rag.utils import plural
from django_rag.validation import positive_int_arg


class Command(RagCommand):
    help = (
        "Re-embed chunks: those embedded by another model than the configured one, every chunk "
        "(--all), or all of them with DJANGO_RAG['NEXT_EMBEDDER'] (a zero-downtime switch)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--collection", help="only this collection (in-place re-embedding)")
        parser.add_argument("--batch-size", type=positive_int_arg, default=64)
        parser.add_argument(
            "--concurrency", type=positive_int_arg, default=1, help="batches embedded at once"
        )
        parser.add_argument("--resume", action="store_true", help="continue the interrupted job")
        parser.add_argument("--all", action="store_true", help="every chunk, current embedder")
        parser.add_argument(
            "--async",
            action="store_true",
            dest="run_async",
            help="enqueue a Celery task and return",
        )
        parser.add_argument("--quiet", action="store_true")

    def handle(self, *args, **options):

        params = {
            "collection": options["collection"],
            "batch_size": options["batch_size"],
            "concurrency": options["concurrency"],
            "all": options["all"],
            "resume": options["resume"],
        }
        try:
            if options["run_async"]:
                job = background.enqueue_reembed(**params)
                self.stdout.write(f"Queued re-embedding as job {job.pk}.")
                return
            bar = ProgressBar(1, self.stderr, enabled=not options["quiet"])
            job = maintenance.reembed(progress=bar, **params)
            bar.close()
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        if not options["quiet"]:
            self.stdout.write(
                f"Re-embedded {plural(job.result.get('reembedded', job.done), 'chunk')} with "
                f"{job.result.get('model')} (job {job.pk})."
            )
