"""What the MCP server adds to a search: the round trip of a ``search`` tool call through the
official SDK's client, over stdio and over streamable HTTP, against ``rag.search()`` called
in-process on the same corpus with the same options.

    python benchmarks/mcp_overhead.py --docs 500 --queries 200
    python benchmarks/mcp_overhead.py --data ../shared/data/scifact --embedder hashing

The corpus is the first ``--docs`` abstracts of a BEIR-format dataset (SciFact by default),
ingested into collection ``mcp-bench`` of the benchmarks' database (benchmarks/settings.py);
the queries are its first ``--queries`` queries, each searched once per path after one warm-up
call (the child process loads its embedder on the first call). ``rag_mcp`` runs as a child
process with ``benchmarks.mcp_settings``; the client runs in this process. Printed: p50 and
p95 per path, the overhead (p50 of the tool call minus p50 of the in-process search) and the
time from starting ``rag_mcp`` on stdio to the answer of the first ``tools/list``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COLLECTION = "mcp-bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(name: str, seconds: list[float]) -> dict:
    return {
        "path": name,
        "p50_ms": statistics.median(seconds) * 1000,
        "p95_ms": percentile(seconds, 0.95) * 1000,
        "calls": len(seconds),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def time_calls(client, queries: list[str], limit: int) -> list[float]:
    await client.call_tool("search", {"query": queries[0], "limit": limit})  # warm-up
    times = []
    for query in queries:
        started = time.perf_counter()
        result = await client.call_tool("search", {"query": query, "limit": limit})
        times.append(time.perf_counter() - started)
        assert not result.is_error, result.content[0].text
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/scifact")
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--embedder", default=None, help="e.g. hashing (default: MiniLM)")
    parser.add_argument(
        "--conn-max-age",
        type=int,
        default=None,
        help="CONN_MAX_AGE of every process (default Django's 0: a connection per call)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.mcp_settings"
    if args.embedder:
        os.environ["DJANGO_RAG_BENCHMARK_EMBEDDER"] = args.embedder
    if args.conn_max_age is not None:
        os.environ["DJANGO_RAG_BENCHMARK_CONN_MAX_AGE"] = str(args.conn_max_age)
    import anyio
    import django

    django.setup()
    from django.core.management import call_command
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    import django_rag as rag
    from django_rag.models import Collection

    call_command("migrate", verbosity=0)
    corpus = [json.loads(line) for line in (args.data / "corpus.jsonl").open()][: args.docs]
    queries = [json.loads(line)["text"] for line in (args.data / "queries.jsonl").open()]
    queries = queries[: args.queries]
    have = Collection.objects.filter(name=COLLECTION).first()
    if have is None or have.documents.count() != len(corpus):
        if have is not None:
            for document in have.documents.all():
                rag.delete(document)
        rag.ingest_many(
            [
                {
                    "text": f"{doc.get('title', '')}\n\n{doc['text']}".strip(),
                    "source_id": doc["_id"],
                    "title": doc.get("title", ""),
                }
                for doc in corpus
            ],
            collection=COLLECTION,
        )

    rag.search(queries[0], collection=COLLECTION, limit=args.limit)  # warm-up
    direct = []
    for query in queries:
        started = time.perf_counter()
        rag.search(query, collection=COLLECTION, limit=args.limit)
        direct.append(time.perf_counter() - started)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stdio = StdioServerParameters(
        command=sys.executable, args=["-m", "django", "rag_mcp"], cwd=str(ROOT), env=env
    )

    async def over(target) -> tuple[float, list[float]]:
        started = time.perf_counter()
        async with Client(target, read_timeout_seconds=300) as client:
            await client.list_tools()
            ready = time.perf_counter() - started
            return ready, await time_calls(client, queries, args.limit)

    stdio_ready, stdio_times = anyio.run(over, stdio)

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "django", "rag_mcp", "--transport", "http", "--port", str(port)],
        cwd=ROOT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("rag_mcp --transport http did not start")
            time.sleep(0.2)
        _, http_times = anyio.run(over, f"http://127.0.0.1:{port}/mcp")
    finally:
        server.terminate()
        server.wait(timeout=30)

    rows = [
        summary("rag.search() in-process", direct),
        summary("MCP search over stdio", stdio_times),
        summary("MCP search over streamable HTTP", http_times),
    ]
    for row in rows[1:]:
        row["overhead_p50_ms"] = row["p50_ms"] - rows[0]["p50_ms"]
    report = {
        "docs": len(corpus),
        "queries": len(queries),
        "limit": args.limit,
        "embedder": args.embedder or "all-MiniLM-L6-v2",
        "conn_max_age": args.conn_max_age or 0,
        "stdio_start_to_tools_list_s": stdio_ready,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{report['docs']} documents, {report['queries']} queries, limit {args.limit}, "
        f"embedder {report['embedder']}, CONN_MAX_AGE {report['conn_max_age']}"
    )
    print("| path | p50 | p95 | overhead (p50) |\n|---|---|---|---|")
    for row in rows:
        overhead = row.get("overhead_p50_ms")
        extra = f"{overhead:+.1f} ms" if overhead is not None else "-"
        print(f"| {row['path']} | {row['p50_ms']:.1f} ms | {row['p95_ms']:.1f} ms | {extra} |")
    print(f"rag_mcp on stdio: start to first tools/list answer {stdio_ready:.2f} s")


if __name__ == "__main__":
    main()
