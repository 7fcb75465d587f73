import signal
import threading

from django_rag import background
from django_rag.management.progress import RagCommand, note


class Command(RagCommand):
    help = (
        "Run background jobs queued in the database (DJANGO_RAG['BACKGROUND'] = 'worker'): claim "
        "one at a time (SELECT ... FOR UPDATE SKIP LOCKED, so any number of workers share the "
        "queue), run it with a heartbeat, repeat. SIGTERM or Ctrl-C stops after the current job."
    )

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="exit when no queued job is left")
        parser.add_argument(
            "--requeue-stalled",
            action="store_true",
            help="first queue every stalled job (no heartbeat for JOBS['STALLED_AFTER_SECONDS']) "
            "again for rag_worker",
        )
        parser.add_argument(
            "--requeue-only",
            action="store_true",
            help="with --requeue-stalled: requeue, then exit without running anything",
        )

    def handle(self, *args, **options):
        for job_id in background.recover_orphaned():
            self.stdout.write(f"Job {job_id}: its worker process is gone; recovered.")
        if options["requeue_stalled"]:
            self._requeue()
            if options["requeue_only"]:
                return
        info = background.describe()
        if info["mode"] != background.WORKER:
            note(
                self.stderr,
                f"Note: BACKGROUND is {info['setting']!r} ({info['mode']}): new jobs are not "
                "queued for rag_worker; this worker runs the ones already queued for it.",
            )
        stop = threading.Event()

        def stop_after_job(signum, frame):
            note(self.stderr, "Stopping after the current job.")
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop_after_job)
        name = background.worker_name()
        self.stdout.write(f"rag_worker {name}: waiting for jobs.")
        ran = background.work(
            burst=options["burst"],
            stop=stop,
            worker=name,
            on_job=lambda job: self.stdout.write(f"Job {job.pk} ({job.kind}): running."),
        )
        self.stdout.write(f"rag_worker {name}: ran {len(ran)} job(s).")

    def _requeue(self):
        from django_rag.exceptions import JobNotRetryable

        for job in background.stalled():
            try:
                background.retry(job, runner=background.WORKER)
            except JobNotRetryable as exc:
                self.stderr.write(f"Job {job.pk}: {exc}")
            else:
                self.stdout.write(f"Job {job.pk} ({job.kind}): stalled, queued again.")
