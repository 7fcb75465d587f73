"""What the bounded parse costs per file: a folder of small files parsed in the calling process,
by the pool of reused workers, and by a fresh fork per file (docs/benchmarks.md, "One bounded
parse for every entry point").

    python benchmarks/bounded_parse.py                 # 500 files, a plain Django process
    python benchmarks/bounded_parse.py --torch         # the caller has torch loaded (a worker)
    python benchmarks/bounded_parse.py --files 2000 --repeat 5
    python benchmarks/bounded_parse.py --hostile       # hostile HTML: CPU and peak, per case

The files are small text, Markdown, HTML and CSV files (a few hundred bytes to 2 KB, a
quarter of each), parsed with :func:`~django_rag.ingestion.isolation.parse_file_isolated`,
the function ``ingest_file``, ``ingest_files``, ``rag_ingest`` and ``sync_folder`` parse
with. Modes: ``in-process`` (``MAX_PARSE_MEMORY = None``, the opt-out: how every entry point
but uploads parsed before), ``pool`` (the default) and ``fork per file``
(``WORKER_MAX_TASKS = 1``: how uploads were parsed before, one child per file). Wall time of
the whole folder, the median of ``--repeat`` runs; each run starts with no worker. No
database and no model are needed.

``--hostile`` parses hostile HTML pages (one element with 25,000 to 100,000 attributes,
500,000 unclosed ``<a>``) with the HTML parser itself, each in a fresh process: its CPU
seconds and its peak resident memory, building the page included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django.conf import settings  # noqa: E402

settings.configure(DJANGO_RAG={}, INSTALLED_APPS=["django_rag"], USE_TZ=True)

import django  # noqa: E402

django.setup()

from django.test import override_settings  # noqa: E402

from django_rag.ingestion import isolation  # noqa: E402

SENTENCE = "Refunds are paid within fourteen days of the request, by the card used to pay. "


def make_folder(directory: Path, count: int) -> list[Path]:
    paths = []
    for n in range(count):
        body = SENTENCE * (2 + n % 20)
        kind = n % 4
        if kind == 0:
            path, text = directory / f"note{n}.txt", body
        elif kind == 1:
            path, text = directory / f"page{n}.md", f"# Policy {n}\n\n{body}\n"
        elif kind == 2:
            path = directory / f"page{n}.html"
            text = (
                f"<html><head><title>Policy {n}</title></head><body><nav>Home</nav>"
                f"<article><h1>Policy {n}</h1><p>{body}</p></article></body></html>"
            )
        else:
            path, text = directory / f"table{n}.csv", "name,days\n" + f"refund,{n}\n" * 20
        path.write_text(text)
        paths.append(path)
    return paths


def run(paths: list[Path], config: dict, max_tasks: int) -> float:
    isolation.reset_pool()
    isolation.WORKER_MAX_TASKS = max_tasks
    with override_settings(DJANGO_RAG=config):
        started = time.perf_counter()
        for path in paths:
            isolation.parse_file_isolated(path)
        elapsed = time.perf_counter() - started
    isolation.reset_pool()
    return elapsed


HOSTILE = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
from django.conf import settings
settings.configure(DJANGO_RAG={}, INSTALLED_APPS=["django_rag"], USE_TZ=True)
import django
django.setup()
from django_rag.exceptions import RagError
from django_rag.ingestion.parsers import parse_bytes
kind, n = sys.argv[1], int(sys.argv[2])
prose = "<p>Refunds are paid within fourteen days of the request.</p>"
if kind == "attributes":
    page = "<html><body><div " + " ".join(f"a{i}" for i in range(n)) + ">" + prose + "</div>"
else:
    page = "<html><body>" + "<a>" * n + prose
data = (page + "</body></html>").encode()
started = time.process_time()
try:
    outcome = "parsed, %d characters" % len(parse_bytes(data, filename="page.html").text)
except RagError as exc:
    outcome = type(exc).__name__
cpu = time.process_time() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"bytes": len(data), "outcome": outcome, "cpu_s": cpu, "peak_mb": peak}))
"""


def hostile() -> None:
    import subprocess

    cases = [("attributes", 25_000), ("attributes", 50_000), ("attributes", 100_000)]
    cases.append(("unclosed", 500_000))
    print(f"{'case':<26} {'bytes':>10} {'CPU s':>6} {'peak MB':>8}  outcome")
    for kind, n in cases:
        done = subprocess.run(
            [sys.executable, "-c", HOSTILE, kind, str(n), str(ROOT)],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        name = f"{n:,} {'attributes' if kind == 'attributes' else 'unclosed <a>'}"
        print(
            f"{name:<26} {result['bytes']:>10,} {result['cpu_s']:>6.2f} "
            f"{result['peak_mb']:>8.0f}  {result['outcome']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--torch", action="store_true", help="import torch in the caller first")
    parser.add_argument("--hostile", action="store_true", help="time hostile HTML pages instead")
    args = parser.parse_args()
    if args.hostile:
        hostile()
        return
    if args.torch:
        import sentence_transformers  # noqa: F401
        import torch  # noqa: F401
    modes = {
        "in-process": ({"MAX_PARSE_MEMORY": None}, isolation.WORKER_MAX_TASKS),
        "pool": ({}, isolation.WORKER_MAX_TASKS),
        "fork per file": ({}, 1),
    }
    with tempfile.TemporaryDirectory() as folder:
        paths = make_folder(Path(folder), args.files)
        run(paths[:20], {"MAX_PARSE_MEMORY": None}, 1)  # load every parser's module here once
        with open("/proc/self/status") as status:
            rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024
        times = {
            mode: statistics.median(run(paths, config, max_tasks) for _ in range(args.repeat))
            for mode, (config, max_tasks) in modes.items()
        }
    base = times["in-process"]
    print(f"{args.files} files, caller RSS {rss:.0f} MB{' (torch loaded)' if args.torch else ''}")
    print(f"{'mode':<14} {'total s':>8} {'ms/file':>8} {'overhead ms/file':>17}")
    for mode, elapsed in times.items():
        per_file = 1000 * elapsed / args.files
        overhead = 1000 * (elapsed - base) / args.files
        print(f"{mode:<14} {elapsed:>8.2f} {per_file:>8.2f} {overhead:>17.2f}")
    print(json.dumps({"files": args.files, "rss_mb": round(rss), "seconds": times}))


if __name__ == "__main__":
    main()
