import json

from django.core.management.base import CommandError

from django_rag.evaluation import (
    METRIC_NAMES,
    compare_runs,
    generate_test_cases,
    import_beir,
    run_evaluation,
)
from django_rag.evaluation.runs import check_collections
from django_rag.exceptions import RagError
from django_rag.management.progress import ProgressBar, RagCommand
from django_rag.models import Run, TestCase
from django_rag.validation import finite_float_arg, positive_int_arg

TABLE_METRICS = (
    "recall_at_1",
    "recall_at_3",
    "recall_at_5",
    "recall_at_10",
    "precision_at_1",
    "precision_at_5",
    "mrr",
    "hit_rate_at_5",
    "ndcg_at_10",
    "faithfulness",
    "correctness",
)


def fail_under(value: str) -> tuple[str, float]:
    name, _, threshold = value.partition("=")
    if name not in (*METRIC_NAMES, "faithfulness", "correctness") or not threshold:
        raise ValueError(value)
    return name, finite_float_arg(threshold)


class Command(RagCommand):
    help = "Evaluate retrieval: generate or import test cases, run, list, show and compare runs."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)

        generate = actions.add_parser("generate", help="LLM-written questions from sampled chunks")
        generate.add_argument("--sample-size", type=positive_int_arg, default=50)
        generate.add_argument("--collection")
        generate.add_argument("--source-id")
        generate.add_argument("--llm")
        generate.add_argument("--seed", type=int)

        run = actions.add_parser("run", help="search every test case and store a run")
        run.add_argument("--mode", help="semantic, fulltext or hybrid")
        run.add_argument("--collection", action="append", help="repeatable")
        run.add_argument("--source-id")
        run.add_argument("--limit", type=positive_int_arg, default=10)
        run.add_argument("--evaluate-answers", action="store_true")
        run.add_argument("--llm")
        run.add_argument(
            "--retriever",
            choices=["search", "agent", "loop"],
            default="search",
            help="what answers each case: search() (default), an agent pipeline (--steps) or "
            "the tool-calling Loop (both use --llm); with --evaluate-answers their own answer "
            "is judged",
        )
        run.add_argument(
            "--steps",
            default="rewrite,search,answer",
            help="the agent's steps, comma-separated (with --retriever agent)",
        )
        run.add_argument(
            "--grounder",
            help="score faithfulness with a grounder (llm, cross-encoder, embedding or a "
            "dotted path) instead of the 0-10 judge",
        )
        run.add_argument(
            "--fail-fast",
            action="store_true",
            help="fail the run at the first retriever error (default: an empty result)",
        )
        run.add_argument("--format", choices=["table", "json"], default="table")
        run.add_argument(
            "--fail-under",
            action="append",
            type=fail_under,
            default=[],
            metavar="METRIC=VALUE",
            help="exit with status 1 when METRIC (e.g. recall_at_5) is below VALUE; repeatable",
        )

        listing = actions.add_parser("list", help="recent runs")
        listing.add_argument("--limit", type=positive_int_arg, default=20)
        listing.add_argument("--format", choices=["table", "json"], default="table")

        show = actions.add_parser("show", help="one run with its configuration")
        show.add_argument("run_id", type=positive_int_arg)
        show.add_argument("--format", choices=["table", "json"], default="table")

        compare = actions.add_parser("compare", help="metric deltas between two runs")
        compare.add_argument("first", type=positive_int_arg)
        compare.add_argument("second", type=positive_int_arg)
        compare.add_argument("--format", choices=["table", "json"], default="table")

        beir = actions.add_parser("import-beir", help="a BEIR dataset as documents + test cases")
        beir.add_argument("path")
        beir.add_argument("--collection", default="beir")
        beir.add_argument("--split", default="test")

    def handle(self, *args, action, **options):
        try:
            getattr(self, "_" + action.replace("-", "_"))(options)
        except (RagError, Run.DoesNotExist) as exc:
            raise CommandError(str(exc)) from exc

    def _progress(self, options):
        return ProgressBar(1, self.stderr, enabled=options["verbosity"] > 0)

    def _generate(self, options):
        # generate_test_cases() returns nothing for an unknown collection (as Arcana does);
        # a name typed on the command line is checked first, so a typo is not "0 generated".
        check_collections([options["collection"]] if options["collection"] else None)
        bar = self._progress(options)
        result = generate_test_cases(
            options["sample_size"],
            collection=options["collection"],
            source_id=options["source_id"],
            llm=options["llm"],
            seed=options["seed"],
            progress=bar,
        )
        bar.close()
        self.stdout.write(
            f"Generated {len(result.created)} test cases ({result.skipped} skipped: unparseable "
            f"or failed LLM answers). {TestCase.objects.count()} test cases in total."
        )

    @staticmethod
    def _retriever(options):
        if options["retriever"] != "agent":
            return options["retriever"]
        steps = [step.strip() for step in options["steps"].split(",") if step.strip()]
        if not steps:
            raise CommandError("--steps needs at least one step name, e.g. search,answer")
        return steps

    def _run(self, options):
        bar = self._progress(options)
        run = run_evaluation(
            mode=options["mode"],
            collection=options["collection"],
            source_id=options["source_id"],
            limit=options["limit"],
            evaluate_answers=options["evaluate_answers"],
            llm=options["llm"],
            progress=bar,
            retriever=self._retriever(options),
            grounder=options["grounder"],
            fail_fast=options["fail_fast"],
        )
        bar.close()
        self._print_run(run, options["format"])
        failures = [
            f"{name} {run.metrics.get(name, 0.0):.4f} < {threshold:.4f}"
            for name, threshold in options["fail_under"]
            if run.metrics.get(name, 0.0) < threshold
        ]
        if failures:
            raise CommandError("Below threshold: " + "; ".join(failures), returncode=1)
        for name, threshold in options["fail_under"]:
            self.stdout.write(f"{name} {run.metrics[name]:.4f} >= {threshold:.4f}: ok")

    def _print_run(self, run, fmt):
        if fmt == "json":
            self.stdout.write(json.dumps(_run_dict(run), indent=2, default=str))
            return
        self.stdout.write(
            f"Run {run.pk}: {run.status}, mode {run.mode}, {run.test_case_count} test cases"
            + (f", {run.metrics.get('skipped')} skipped" if run.metrics.get("skipped") else "")
        )
        if run.error:
            self.stdout.write(f"  error: {run.error}")
        for name in TABLE_METRICS:
            if name in run.metrics:
                value = run.metrics[name]
                shown = (
                    f"{value:.2f}/10" if name in ("faithfulness", "correctness") else f"{value:.4f}"
                )
                self.stdout.write(f"  {name:<16} {shown}")

    def _list(self, options):
        runs = list(Run.objects.all()[: options["limit"]])
        if options["format"] == "json":
            self.stdout.write(
                json.dumps([_run_dict(r, results=False) for r in runs], indent=2, default=str)
            )
            return
        if not runs:
            self.stdout.write("No runs yet: manage.py rag_eval run")
            return
        self.stdout.write(
            f"{'id':>5}  {'started':<19}  {'status':<9}  {'mode':<8}  {'cases':>5}  {'recall@5':>8}  {'mrr':>6}  {'ndcg@10':>7}"
        )
        for r in runs:
            m = r.metrics
            self.stdout.write(
                f"{r.pk:>5}  {r.started_at:%Y-%m-%d %H:%M:%S}  {r.status:<9}  {r.mode:<8}  "
                f"{r.test_case_count:>5}  {m.get('recall_at_5', 0):>8.4f}  {m.get('mrr', 0):>6.4f}  "
                f"{m.get('ndcg_at_10', 0):>7.4f}"
            )

    def _show(self, options):
        run = Run.objects.get(pk=options["run_id"])
        if options["format"] == "json":
            self.stdout.write(json.dumps(_run_dict(run), indent=2, default=str))
            return
        self._print_run(run, "table")
        self.stdout.write("  config: " + json.dumps(run.config, default=str))

    def _compare(self, options):
        table = compare_runs(options["first"], options["second"])
        if options["format"] == "json":
            self.stdout.write(json.dumps(table, indent=2))
            return
        self.stdout.write(
            f"{'metric':<16} {'run ' + str(options['first']):>10} {'run ' + str(options['second']):>10} {'delta':>9}"
        )
        paired = table.pop("paired_ndcg_at_10", None)
        for name, row in table.items():
            first = "-" if row["first"] is None else f"{row['first']:.4f}"
            second = "-" if row["second"] is None else f"{row['second']:.4f}"
            delta = "-" if row["delta"] is None else f"{row['delta']:+.4f}"
            self.stdout.write(f"{name:<16} {first:>10} {second:>10} {delta:>9}")
        if paired is not None:
            self.stdout.write(
                f"paired nDCG@10 difference over {paired['cases']} common test cases: "
                f"{paired['delta']:+.4f} (95% bootstrap interval {paired['low']:+.4f} .. "
                f"{paired['high']:+.4f}; an interval that excludes 0 is beyond noise)"
            )

    def _import_beir(self, options):
        bar = self._progress(options)
        counts = import_beir(
            options["path"], collection=options["collection"], split=options["split"], progress=bar
        )
        bar.close()
        self.stdout.write(
            f"Imported {counts['documents']} documents and {counts['test_cases']} test cases "
            f"({counts['relevance']} relevance judgements) into {options['collection']!r}; "
            f"{counts['existing_test_cases']} already there, {counts['skipped_queries']} queries "
            "without judged documents skipped."
        )


def _run_dict(run, *, results=True):
    data = {
        "id": run.pk,
        "status": run.status,
        "mode": run.mode,
        "test_case_count": run.test_case_count,
        "metrics": run.metrics,
        "config": run.config,
        "usage": run.usage,
        "error": run.error,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }
    if results:
        data["results"] = run.results
    return data
