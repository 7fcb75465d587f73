import json

from django.core.management.base import CommandError

from django_rag.agent import Agent, Loop, ask
from django_rag.agent.steps import STEPS
from django_rag.conf import scrub_text
from django_rag.exceptions import RagError, UnknownCollection
from django_rag.management.progress import THRESHOLD_HELP, RagCommand, note
from django_rag.models import Collection
from django_rag.models.databases import search_db
from django_rag.retrieval.request import normalize_mode
from django_rag.validation import clean_collection_names, finite_float_arg, positive_int_arg

# Options of a step that come from other arguments of the command. --ground takes a grounder
# (and also grounds a plain ask), so it is declared below, not as a step flag.
STEP_OPTIONS = {
    "rerank": lambda options: {"threshold": options["rerank_threshold"]},
    "ground": lambda options: {"grounder": options["ground"]},
}


def pipeline_flags() -> list[tuple[str, str, str]]:
    """``(option dest, flag, help)`` for each optional pipeline step of the agent's registry
    and each boolean option a step offers (``--self-correct``), in the order they run."""
    flags = []
    for spec in STEPS.in_order():
        if not spec.pipeline:
            continue
        if not spec.always and spec.name != "ground":
            flags.append((spec.name, spec.name, f"run the {spec.name} step: {spec.summary}"))
        flags += [(flag, flag, f"{label} ({spec.name} step)") for flag, label in spec.flags]
    return [(dest, "--" + flag.replace("_", "-"), text) for dest, flag, text in flags]


class Command(RagCommand):
    help = (
        "Answer a question from the ingested documents with an LLM. Any pipeline flag "
        "(one per agent step: --gate, --rewrite, --select, --expand, --decompose, --reason, "
        "--rerank, and --self-correct) runs the agentic pipeline instead of a single ask(); "
        "--loop lets the model search with tools until it answers."
    )

    def add_arguments(self, parser):
        parser.add_argument("question")
        parser.add_argument(
            "--llm", default=None, help="litellm model (default: DJANGO_RAG['LLM'])"
        )
        parser.add_argument("--mode", default=None, help="semantic, fulltext or hybrid")
        parser.add_argument(
            "--limit",
            type=positive_int_arg,
            default=5,
            help="most chunks given to the LLM to answer from (default: 5)",
        )
        parser.add_argument("--threshold", type=finite_float_arg, default=None, help=THRESHOLD_HELP)
        parser.add_argument("--collection", action="append", default=None, help="repeatable")
        parser.add_argument("--source-id", default=None)
        parser.add_argument("--stream", action="store_true", help="print the answer as it comes")
        parser.add_argument("--json", action="store_true", help="print the answer as JSON")
        for dest, flag, text in pipeline_flags():
            parser.add_argument(flag, dest=dest, action="store_true", help=text)
        parser.add_argument(
            "--rerank-threshold",
            type=finite_float_arg,
            default=None,
            help="LLM reranker minimum (0-10)",
        )
        parser.add_argument(
            "--loop",
            action="store_true",
            help="run the tool-calling Loop agent (the model searches until it answers)",
        )
        parser.add_argument(
            "--max-iterations",
            type=positive_int_arg,
            default=5,
            help="the loop's most controller turns",
        )
        parser.add_argument(
            "--answer-llm", default=None, help="litellm model writing the loop's final answer"
        )
        parser.add_argument(
            "--ground",
            nargs="?",
            const=True,
            default=None,
            metavar="GROUNDER",
            help="check the answer against its sources (the GROUNDER setting, or llm, "
            "cross-encoder, embedding, a dotted path) and print the unsupported sentences",
        )

    def handle(self, *args, question, **options):
        try:
            self._check(options)
            if options["loop"]:
                if options["stream"] or self._pipeline_asked(options):
                    raise CommandError("--loop works alone: no --stream nor pipeline flags")
                answer = self._loop(question, options)
            elif self._pipeline_asked(options):
                if options["stream"]:
                    raise CommandError("--stream works with a plain ask, not with pipeline flags")
                answer = self._pipeline(question, options)
            elif options["stream"] and not options["json"]:
                stream = ask(question, stream=True, **self._ask_options(options))
                try:
                    for piece in stream:
                        self.stdout.write(piece, ending="")
                        self.stdout.flush()
                finally:
                    self.stdout.write("")  # end the partial line before any error
                self._sources(stream.answer)
                return
            else:
                answer = ask(question, **self._ask_options(options))
        except RagError as exc:
            # A stream cut off part way lands here too: exit status 1, the error on stderr.
            raise CommandError(scrub_text(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps(answer.to_dict(), indent=2, default=str))
            return
        self.stdout.write(answer.text)
        self._sources(answer)

    def _pipeline_asked(self, options) -> bool:
        return any(options.get(dest) for dest, _, _ in pipeline_flags())

    def _check(self, options):
        """What can be checked without a model or an LLM call, before any: the mode and the
        collections (a pipeline's gate or rewrite step would otherwise call the LLM first)."""
        if options["mode"] is not None:
            normalize_mode(options["mode"])
        names = clean_collection_names(options["collection"])
        if names:
            known = set(
                Collection.objects.using(search_db())
                .filter(name__in=names)
                .values_list("name", flat=True)
            )
            for name in names:
                if name not in known:
                    raise UnknownCollection(name)

    def _ask_options(self, options):
        return {
            "llm": options["llm"],
            "mode": options["mode"],
            "limit": options["limit"],
            "threshold": options["threshold"],
            "collection": options["collection"],
            "source_id": options["source_id"],
            "ground": options["ground"] or False,
        }

    def _pipeline(self, question, options):
        search_options = {"mode": options["mode"]} if options["mode"] else {}
        if options["source_id"]:
            search_options["source_id"] = options["source_id"]
        agent = Agent(
            question,
            llm=options["llm"],
            collection=options["collection"],
            limit=options["limit"],
            threshold=options["threshold"],
            **search_options,
        )
        # The registry's steps in their order: the search and the answer always, the others
        # when their flag is given (the collections chosen are the run's scope).
        for spec in STEPS.pipeline({name for name in STEPS if options.get(name)}):
            step_options = STEP_OPTIONS.get(spec.name, lambda _: {})(options)
            step_options |= {flag: True for flag, _ in spec.flags if options.get(flag)}
            getattr(agent, spec.name)(**step_options)
        context = agent.context
        if context.error is not None:
            raise CommandError(
                f"The {context.failed_step} step failed: {scrub_text(context.error)}"
            )
        if options["verbosity"] > 1:
            for warning in context.warnings:
                self.stderr.write(f"warning: {scrub_text(warning)}", style_func=self.style.WARNING)
        return agent.result

    def _loop(self, question, options):
        search_options = {"mode": options["mode"]} if options["mode"] else {}
        if options["source_id"]:
            search_options["source_id"] = options["source_id"]
        result = Loop(
            question,
            collection=options["collection"],
            llm=options["llm"],
            answer_llm=options["answer_llm"],
            max_iterations=options["max_iterations"],
            limit=options["limit"],
            max_limit=max(options["limit"], 20),
            threshold=options["threshold"],
            ground=options["ground"] or False,
            **search_options,
        ).run()
        if options["verbosity"] > 1:
            for step in result.tool_calls:
                arguments = json.dumps(step.arguments)
                outcome = (
                    f"error: {step.error}"
                    if step.error
                    else (
                        f"{len(step.new_chunk_ids)} new source(s)"
                        if step.name == "search"
                        else "ok"
                    )
                )
                note(
                    self.stderr,
                    f"turn {step.iteration}: {step.name}({scrub_text(arguments)}) -> "
                    f"{scrub_text(outcome)}",
                )
            note(self.stderr, f"stopped: {result.stop_reason} after {result.iterations} turn(s)")
        if result.error is not None and not result.text:
            raise CommandError(
                f"The loop stopped ({result.stop_reason}) after {result.iterations} turn(s): "
                f"{scrub_text(result.error)}"
            )
        if result.stop_reason == "give_up" and not options["json"]:
            note(self.stderr, "The model gave up: the documents do not seem to answer this.")
        return result

    def _sources(self, answer):
        grounding = getattr(answer, "grounding", None)
        failed = [w for w in getattr(answer, "warnings", None) or [] if w.startswith("ground: ")]
        if grounding is None and failed:
            self.stdout.write(f"\nGrounding: {scrub_text(failed[-1])}")
        if grounding is not None:
            faithful = len(grounding.spans) - len(grounding.unsupported)
            self.stdout.write(
                f"\nGrounding ({grounding.grounder}): score {grounding.score:.2f}, "
                f"{faithful} of {len(grounding.spans)} spans supported"
            )
            for span in grounding.unsupported:
                ids = ", ".join(str(i) for i in span.chunk_ids)
                self.stdout.write(
                    f"  {span.verdict}: {span.text}" + (f" (chunks {ids})" if ids else "")
                )
            for warning in grounding.warnings:
                self.stdout.write(f"  warning: {scrub_text(warning)}")
        if not answer.citations:
            return
        self.stdout.write("\nSources:")
        for citation in answer.citations:
            self.stdout.write(f"  [{citation.number}] {citation.chunk.label}")
