"""Conversations on HotpotQA: does condensing a follow-up bring back the gold paragraphs, and
what does the HTTP API add to a request?

    python benchmarks/chat.py                       # ../shared/data/hotpotqa_dev200
    python benchmarks/chat.py --data PATH --questions 50
    python benchmarks/chat.py --llm openai/gpt-4o-mini   # condense with a real LLM

Each question is asked as the second turn of a conversation whose first turn is about one of
its gold entities: "Tell me about Langston Hughes." then the question with that entity's name
replaced by "it" ("which writer has the highest number of skill it or Ian McEwan"). Questions
that name none of their gold paragraphs' titles are skipped (counted in the output).
Recall@10 of the two gold paragraphs is measured on the chunks ``rag.chat`` answered from
(hybrid search, limit 10, the real MiniLM), with the query retrieval searched:

- ``raw``: condensing off (``condenser=None``): the follow-up as typed;
- ``previous turn``: a condenser function that prepends the previous user message, the cheap
  LLM-free way to carry context;
- ``llm``: the built-in LLM condenser. Without ``--llm`` no LLM can be reached here, so a
  scripted LLM stands in and replies with the original question: a **perfect condenser**, the
  upper bound of what condensing can win, not a measurement of any model;
- ``original question``: the question as HotpotQA wrote it (the same bound, for reference).

API overhead: ``POST /rag/api/search`` and ``POST /rag/api/conversations/{id}/messages`` (a
scripted answer) through a threaded WSGI server and ``requests``, minus the time of the
operation inside the request (the ``search`` and ``chat`` telemetry spans): authentication
(the ``API["AUTHENTICATE"]`` hook), rate-limit and budget counters (local-memory cache),
routing, validation, JSON and HTTP.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.chat_settings"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

import django_rag as rag  # noqa: E402
from benchmarks.beir import percentile  # noqa: E402
from django_rag import conf  # noqa: E402
from django_rag.evaluation.beir import corpus_document  # noqa: E402
from django_rag.models import Collection, Document  # noqa: E402
from django_rag.signals import operation_finished  # noqa: E402
from django_rag.testing import ScriptedLLM  # noqa: E402

COLLECTION = "hotpot"
LIMIT = 10


def load(data: Path):
    corpus = [json.loads(line) for line in (data / "corpus.jsonl").open()]
    queries = [json.loads(line) for line in (data / "queries.jsonl").open()]
    gold: dict[str, set[str]] = {}
    for number, line in enumerate((data / "qrels" / "test.tsv").open()):
        parts = line.rstrip("\n").split("\t")
        if number == 0 and not parts[-1].strip().isdigit():
            continue
        gold.setdefault(parts[0], set()).add(parts[1])
    return corpus, queries, gold


def conversation(question: str, titles: list[str]) -> tuple[str, str] | None:
    """(first turn, follow-up) for ``question``, or None when it names no gold title."""
    named = [t for t in titles if t.lower() in question.lower()]
    if not named:
        return None
    entity = max(named, key=len)
    follow_up = re.sub(re.escape(entity), "it", question, count=1, flags=re.IGNORECASE)
    return f"Tell me about {entity}.", follow_up


def previous_turn(message, turns):
    """The LLM-free condenser: the previous user message, then the follow-up."""
    last = [text for role, text in turns if role == "user"]
    return f"{last[-1]} {message}" if last else message


def ensure_corpus(corpus) -> None:
    call_command("migrate", verbosity=0)
    if Document.objects.filter(collection__name=COLLECTION).count() == len(corpus):
        return
    Collection.objects.filter(name=COLLECTION).delete()
    start = time.perf_counter()
    rag.ingest_many(
        (corpus_document(d) for d in corpus),
        collection=COLLECTION,
    )
    print(f"ingested {len(corpus)} paragraphs in {time.perf_counter() - start:.0f} s")


def recall(chunks, relevant: set[str]) -> float:
    found = {chunk.source_id for chunk in chunks[:LIMIT]}
    return len(found & relevant) / len(relevant)


def retrieval(queries, gold, titles_of, llm_spec, limit_questions):
    answerer = ScriptedLLM(default="Noted [1].")
    variants = ("raw", "previous turn", "llm", "original question")
    scores = {name: [] for name in variants}
    condensed_equal = 0
    skipped = 0
    asked = 0
    for query in queries:
        if limit_questions and asked >= limit_questions:
            break
        relevant = gold.get(query["_id"])
        if not relevant:
            continue
        pair = conversation(query["text"], [titles_of[d] for d in relevant])
        if pair is None:
            skipped += 1
            continue
        asked += 1
        first, follow_up = pair
        for name in variants:
            options = dict(llm=answerer, collection=COLLECTION, mode="hybrid", limit=LIMIT)
            if name == "original question":
                reply = rag.chat(query["text"], **options)
                scores[name].append(recall(reply.answer.chunks, relevant))
                continue
            start = rag.chat(first, **options)
            if name == "raw":
                condenser = None
            elif name == "previous turn":
                condenser = previous_turn
            else:
                condenser = "llm"
            condense_llm = llm_spec or ScriptedLLM(default=query["text"])
            reply = rag.chat(
                follow_up,
                conversation=start.conversation,
                condenser=condenser,
                condense_llm=condense_llm,
                **options,
            )
            if name == "llm" and reply.query == query["text"].strip():
                condensed_equal += 1
            scores[name].append(recall(reply.answer.chunks, relevant))
    return scores, asked, skipped, condensed_equal


class Spans:
    """Durations of the telemetry spans named ``event`` (collected from every thread)."""

    def __init__(self, event: str):
        self.event, self.durations, self.lock = event, [], threading.Lock()
        operation_finished.connect(self.receive, weak=False)

    def receive(self, sender, *, event, duration, **kwargs):
        if event == self.event:
            with self.lock:
                self.durations.append(duration)

    def close(self):
        operation_finished.disconnect(self.receive)


def _measure(post, texts, event, conv_path):
    """Round trips of ``post(path, body)`` and the ``event`` spans inside them."""
    spans = Spans(event)
    rounds = []
    for text in texts:
        if event == "search":
            path, body = "/search", {"query": text, "collection": COLLECTION, "mode": "hybrid"}
        else:
            path, body = conv_path, {"message": text, "mode": "hybrid", "limit": LIMIT}
        start = time.perf_counter()
        status = post(path, body)
        rounds.append(time.perf_counter() - start)
        assert status == 200, status
    spans.close()
    assert len(spans.durations) == len(rounds), (len(spans.durations), len(rounds))
    overheads = [r - s for r, s in zip(rounds, spans.durations, strict=True)]
    return {
        "round_trip_p50_ms": 1000 * statistics.median(rounds),
        "inside_p50_ms": 1000 * statistics.median(spans.durations),
        "overhead_p50_ms": 1000 * statistics.median(overheads),
        "overhead_p95_ms": 1000 * percentile(overheads, 95),
        "requests": len(rounds),
    }


def api_overhead(queries, requests_count: int):
    """Over real HTTP (a threaded WSGI server: a new thread, so a new database connection,
    per request) and in-process through Django's test client (no socket, one connection):
    the difference between the two is transport and connection set-up."""
    import requests
    from django.contrib.auth.models import User
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application
    from django.test import Client

    User.objects.get_or_create(username="benchmark")

    class Quiet(WSGIRequestHandler):
        def setup(self):
            super().setup()
            # As production servers do: without it, the response's header and body writes
            # meet the client's delayed ACK (Nagle), adding ~40 ms that no deployment pays.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args):
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
    server.set_app(get_wsgi_application())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}/rag/api"
    session = requests.Session()
    session.headers["Authorization"] = "Bearer benchmark"
    client = Client(HTTP_AUTHORIZATION="Bearer benchmark")
    texts = [q["text"] for q in queries][:requests_count]

    def over_http(path, body):
        return session.post(base + path, json=body).status_code

    def in_process(path, body):
        return client.post("/rag/api" + path, body, content_type="application/json").status_code

    results = {}
    try:
        for transport, post in (("HTTP", over_http), ("in-process", in_process)):
            post("/search", {"query": "warm up", "collection": COLLECTION})
            for label, event in (("search", "search"), ("chat message", "chat")):
                conv_path = ""
                if event == "chat":
                    created = session.post(base + "/conversations", json={}).json()["id"]
                    conv_path = f"/conversations/{created}/messages"
                results[(transport, label)] = _measure(post, texts, event, conv_path)
    finally:
        server.shutdown()
        server.server_close()
    return results


def benchmark_user(request):
    from django.contrib.auth.models import User

    if request.headers.get("Authorization") == "Bearer benchmark":
        return User.objects.get(username="benchmark")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, default=ROOT.parent / "shared" / "data" / "hotpotqa_dev200"
    )
    parser.add_argument("--questions", type=int, default=0, help="only the first N (0: all)")
    parser.add_argument("--llm", default=None, help="a litellm model that condenses")
    parser.add_argument("--requests", type=int, default=100, help="API requests per endpoint")
    args = parser.parse_args()

    settings.DJANGO_RAG = {
        "LLM": ScriptedLLM(default="Noted [1]."),
        "API": {
            "AUTHENTICATE": "benchmarks.chat.benchmark_user",
            "RATE_LIMIT": None,
            "TOKEN_BUDGET": None,
            "READ_ALL": "authenticated",  # the benchmark user is not staff
        },
    }
    conf.get_settings.cache_clear()
    corpus, queries, gold = load(args.data)
    titles_of = {d["_id"]: d["title"] for d in corpus}
    ensure_corpus(corpus)

    start = time.perf_counter()
    scores, asked, skipped, equal = retrieval(queries, gold, titles_of, args.llm, args.questions)
    seconds = time.perf_counter() - start
    condenser = args.llm or "scripted stand-in replying with the original question"
    print(
        f"\n{asked} conversations ({skipped} questions skipped: they name no gold title), "
        f"{seconds:.0f} s; llm condenser: {condenser}"
    )
    if not args.llm:
        print(f"(the stand-in's query was used {equal}/{asked} times)")
    print("\n| follow-up searched as | Recall@10 |")
    print("|---|---|")
    for name, values in scores.items():
        print(f"| {name} | {statistics.fmean(values):.3f} |")

    overhead = api_overhead(queries, args.requests)
    print(
        "\n| endpoint | transport | round trip p50 | inside (span) p50 | overhead p50 | "
        "overhead p95 | n |"
    )
    print("|---|---|---|---|---|---|---|")
    for (transport, label), r in overhead.items():
        print(
            f"| {label} | {transport} | {r['round_trip_p50_ms']:.1f} ms | "
            f"{r['inside_p50_ms']:.1f} ms | {r['overhead_p50_ms']:.2f} ms | "
            f"{r['overhead_p95_ms']:.2f} ms | {r['requests']} |"
        )


if __name__ == "__main__":
    main()
