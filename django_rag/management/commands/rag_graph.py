from django.core.management.base import CommandError

from django_rag.exceptions import RagError
from django_rag.graph import builder, communities
from django_rag.management.progress import ProgressBar, RagCommand
from django_rag.utils import plural
from django_rag.validation import positive_float_arg, positive_int_arg


def levels_arg(value: str):
    if value == "all":
        return value
    try:
        levels = [int(part) for part in value.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(value) from exc
    if not levels or any(level < 0 for level in levels):
        raise ValueError(value)
    return levels


class Command(RagCommand):
    help = "Build the knowledge graph, detect communities and summarise them."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        rebuild = actions.add_parser("rebuild", help="extract entities and relationships")
        rebuild.add_argument("--collection")
        rebuild.add_argument(
            "--resume",
            action="store_true",
            help="only chunks not processed yet (default: rebuild from scratch)",
        )
        rebuild.add_argument("--concurrency", type=positive_int_arg)
        detect = actions.add_parser("detect-communities", help="hierarchical Leiden")
        detect.add_argument("--collection")
        detect.add_argument("--resolution", type=positive_float_arg)
        detect.add_argument(
            "--levels", type=positive_int_arg, help="how many hierarchy levels to keep"
        )
        detect.add_argument("--seed", type=int)
        detect.add_argument("--min-size", type=positive_int_arg)
        summarize = actions.add_parser("summarize-communities", help="LLM summaries")
        summarize.add_argument("--collection")
        summarize.add_argument("--levels", type=levels_arg, help="e.g. 0 or 0,1 or all")
        summarize.add_argument("--force", action="store_true", help="also unchanged communities")
        summarize.add_argument("--concurrency", type=positive_int_arg)
        summarize.add_argument("--llm")
        for sub in (rebuild, detect, summarize):
            sub.add_argument("--quiet", action="store_true")

    def handle(self, *args, action, **options):

        bar = ProgressBar(1, self.stderr, enabled=not options["quiet"])
        try:
            if action == "rebuild":
                result = builder.build_graph(
                    options["collection"],
                    resume=options["resume"],
                    concurrency=options["concurrency"],
                    progress=bar,
                )
                message = (
                    f"Processed {plural(result['chunks'], 'chunk')} ({result['failed']} skipped after "
                    f"extraction errors); the graph now holds {result['entities']} entities and "
                    f"{result['relationships']} relationships."
                )
            elif action == "detect-communities":
                result = communities.detect_communities(
                    options["collection"],
                    resolution=options["resolution"],
                    levels=options["levels"],
                    seed=options["seed"],
                    min_size=options["min_size"],
                    progress=bar,
                )
                message = (
                    f"Detected {result['communities']} communities in "
                    f"{result['collections']} collection(s)."
                )
            else:
                result = communities.summarize_communities(
                    options["collection"],
                    llm=options["llm"],
                    force=options["force"],
                    levels=options["levels"],
                    concurrency=options["concurrency"],
                    progress=bar,
                )
                message = (
                    f"Summarised {result['summaries']} of {result['communities']} communities "
                    f"({result['failed']} failed; the others were up to date)."
                )
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            bar.close()
        self.stdout.write(message)
