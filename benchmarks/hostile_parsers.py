"""CPU time of the parsers of model output on hostile replies, and the Loop against a reply
holding 300 tool calls (docs/benchmarks.md, "Hostile model output").

    python benchmarks/hostile_parsers.py            # every case
    python benchmarks/hostile_parsers.py --quick    # skip the Loop case (about 90 s before)

Each parser case is timed with ``time.process_time()`` (CPU seconds of this process) around
one call; the Loop case is wall time, since its tool sleeps like a slow search. No database
and no model are needed: the LLM is a scripted one. Run it on older code by copying it into
that checkout's benchmarks/ folder (it only uses APIs every version has).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django.conf import settings  # noqa: E402

settings.configure(DJANGO_RAG={}, INSTALLED_APPS=["django_rag"], USE_TZ=True)

import django  # noqa: E402

django.setup()

from django_rag.agent import Context, Loop, steps  # noqa: E402
from django_rag.answers.grounding import split_sentences  # noqa: E402
from django_rag.conf import scrub_text  # noqa: E402
from django_rag.exceptions import RagError  # noqa: E402
from django_rag.llm import parse_json  # noqa: E402
from django_rag.testing import ScriptedLLM  # noqa: E402


def valid_json(size: int) -> str:
    """A graph-extraction-like reply of about ``size`` characters of valid JSON."""
    entities, length, i = [], 20, 0
    while length < size:
        entity = {
            "name": f"Entity {i}",
            "type": "concept",
            "description": f"The {i}th thing the chunk mentions, with a longer description.",
        }
        entities.append(entity)
        length += len(json.dumps(entity)) + 2
        i += 1
    return json.dumps({"entities": entities, "relationships": []})


def cpu(function, *args, **kwargs) -> tuple[float, str]:
    start = time.process_time()
    try:
        result = function(*args, **kwargs)
        outcome = result if isinstance(result, str) and len(result) < 20 else type(result).__name__
    except RagError as exc:
        outcome = type(exc).__name__
    return time.process_time() - start, outcome


def gate_step(reply: str) -> str:
    ctx = steps.gate(Context("Which plan has phone support?", llm=ScriptedLLM(reply)))
    return "fell back" if ctx.warnings else "decided"


def loop_case(calls: int, seconds: float, deadline: float) -> None:
    def slow_lookup(query: str) -> str:
        """Look something up (slowly)."""
        time.sleep(seconds)
        return f"nothing about {query}"

    reply = [("slow_lookup", {"query": f"q{i}"}) for i in range(calls)]
    options = {}
    if "max_tool_calls" in inspect.signature(Loop).parameters:
        options["max_tool_calls"] = calls  # no cap: only the deadline stops it
    llm = ScriptedLLM(reply, default=("answer", {"text": "done"}))
    for label, extra in (("no cap, deadline only", options), ("default cap", {})):
        if label == "default cap" and not options:
            continue  # older code has no cap
        start = time.perf_counter()
        result = Loop(
            "Find everything.", llm=llm, tools=[slow_lookup], deadline=deadline, **extra
        ).run()
        llm.responses = [reply]
        ran = sum(
            1
            for step in result.tool_calls
            if step.name == "slow_lookup" and not step.result.startswith("Not run")
        )
        print(
            f"| Loop, {calls} calls of a {seconds} s tool in one reply, deadline={deadline:g} "
            f"({label}) | {time.perf_counter() - start:.2f} s wall | {ran} tool calls run, "
            f"stop_reason={result.stop_reason} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="skip the Loop case")
    args = parser.parse_args()
    import django_rag

    print(f"django_rag from {Path(django_rag.__file__).parent}")
    big = valid_json(1_100_000)
    cases = [
        ("parse_json, 20,000 `{`", parse_json, "{" * 20_000),
        (f"parse_json, valid JSON of {len(big):,} characters", parse_json, big),
        ("gate step, a reply of 15,000 `{`", gate_step, "{" * 15_000),
        ("split_sentences, `a` + 40,000 dots", split_sentences, "a" + "." * 40_000),
        ("split_sentences, `a` + 20,000 `!?`", split_sentences, "a" + "!?" * 20_000),
        ("split_sentences, `a` + 40,000 spaces + `b`", split_sentences, "a" + " " * 40_000 + "b"),
        ("scrub_text, a 20,000-letter word", scrub_text, "a" * 20_000),
    ]
    print("| case | CPU | outcome |")
    print("|---|---|---|")
    for label, function, text in cases:
        seconds, outcome = cpu(function, text)
        print(f"| {label} | {seconds:.3f} s | {outcome} |", flush=True)
    if not args.quick:
        loop_case(300, 0.3, 5.0)


if __name__ == "__main__":
    main()
