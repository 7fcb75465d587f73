import json

from django.core.management.base import CommandError

from django_rag.conf import search_setting
from django_rag.exceptions import RagError
from django_rag.management.progress import THRESHOLD_HELP, RagCommand
from django_rag.retrieval.service import search
from django_rag.store.search_modes import score_legend as mode_legend
from django_rag.validation import finite_float_arg, positive_int_arg


class Command(RagCommand):
    help = "Search the ingested chunks and print the best matches."

    def add_arguments(self, parser):
        parser.add_argument("query")
        parser.add_argument(
            "--mode", default=None, help="semantic, fulltext or hybrid (default: SEARCH['MODE'])"
        )
        parser.add_argument(
            "--fusion", default=None, help="hybrid fusion: adaptive, weighted or rrf"
        )
        parser.add_argument(
            "--limit",
            type=positive_int_arg,
            default=None,
            help="most results to print (default: SEARCH['LIMIT'], 10)",
        )
        parser.add_argument("--threshold", type=finite_float_arg, default=None, help=THRESHOLD_HELP)
        parser.add_argument(
            "--collection", action="append", default=None, help="repeat for several"
        )
        parser.add_argument("--source-id", default=None)
        parser.add_argument(
            "--syntax",
            choices=["natural", "websearch"],
            default=None,
            help='how full-text mode reads the query: natural (default; quotes and "-" never '
            'filter) or websearch ("phrase" required, -word excluded)',
        )
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(
        self, *args, query, mode, fusion, limit, threshold, collection, source_id, syntax, **options
    ):
        try:
            results = search(
                query,
                mode=mode,
                fusion=fusion,
                limit=limit,
                threshold=threshold,
                collection=collection,
                source_id=source_id,
                syntax=syntax,
            )
        except RagError as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps([r.to_dict() for r in results], indent=2, default=str))
            return
        if not results:
            self.stdout.write("No results.")
            return
        for rank, result in enumerate(results, start=1):
            snippet = " ".join(result.text.split())
            snippet = snippet[:160] + ("..." if len(snippet) > 160 else "")
            self.stdout.write(
                f"{rank:>2}. {result.score:.3f}  [{result.collection}] {result.label} "
                f"#{result.chunk_index}\n    {snippet}"
            )
        self.stdout.write(score_legend(mode, fusion))


def score_legend(mode: str | None, fusion: str | None) -> str:
    """One line saying what the printed scores mean for the mode (and fusion) searched."""
    return mode_legend(mode or search_setting("MODE"), fusion or search_setting("FUSION"))
