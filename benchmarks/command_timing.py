"""Command start-up: wall and CPU time of ``manage.py rag_*`` commands run as a user runs them.

Each command is a fresh ``python manage.py ...`` subprocess of a throw-away project (the app's
defaults: the bundled MiniLM embedder, the embedded PostgreSQL). Wall time is measured around
the subprocess; CPU time is the user + system time of the finished child
(``resource.getrusage(RUSAGE_CHILDREN)`` before and after), so it includes imports, Django's
set-up, the model load and the command's own work, but not the PostgreSQL server's (a separate,
already running process). ``python -c "import torch"`` is timed the same way in the same run:
the floor for any command that computes a vector with torch.

    python benchmarks/command_timing.py --runs 5

Timed, each ``--runs`` times (the median is printed, and every sample with ``--json``):

- ``python -c "import torch"`` and ``python -c "import sentence_transformers"``;
- ``rag_search QUERY --mode fulltext`` (no model needed);
- ``rag_search QUERY --mode semantic --json`` (embeds the query with the bundled MiniLM);
- ``rag_search QUERY --mode semantic --collection missing`` (an error: how soon it comes);
- ``rag_ingest FILE`` of a small text file (about 200 words; new content each run, so it is
  embedded and stored every time).

The code timed is the ``django_rag`` the subprocesses import (the ``PYTHONPATH`` of this run);
it is printed first. Set-up (start the server, ``migrate``, ingest a few documents to search)
is not timed. The data directory is a new temporary one, removed at the end, unless
``--data-dir`` names one to keep.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SETTINGS = """\
import os
from pathlib import Path

from django_rag.embedded import database_settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SECRET_KEY = "command-timing-only"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.postgres",
    "django_rag",
]
ROOT_URLCONF = "timingproject.urls"
DATABASES = {{"default": database_settings(Path({data_dir!r}))}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""

MANAGE = """\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "timingproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""

DOCUMENTS = [
    "Refunds are processed within five business days of the return reaching our warehouse.",
    "Our support team answers email within one working day, and chat during office hours.",
    "Shipping is free for orders above fifty euros; express delivery costs extra.",
    "A damaged parcel must be reported within forty-eight hours with a photo of the box.",
]


def make_project(directory: Path, data_dir: Path) -> None:
    package = directory / "timingproject"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "urls.py").write_text("urlpatterns = []\n")
    (package / "settings.py").write_text(SETTINGS.format(data_dir=str(data_dir)))
    (directory / "manage.py").write_text(MANAGE)


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """Run ``command``; its wall and CPU seconds, exit status and the first stderr line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall": wall,
        "cpu": cpu,
        "returncode": done.returncode,
        "stdout_bytes": len(done.stdout),
        "stderr": done.stderr.strip().splitlines()[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="samples per command (median shown)")
    parser.add_argument("--data-dir", type=Path, help="embedded server data directory to keep")
    parser.add_argument("--json", action="store_true", help="print every sample as JSON")
    parser.add_argument(
        "--throughput",
        type=int,
        metavar="N",
        help="instead: passages/s of the bundled MiniLM through django_rag's encoder and "
        "through SentenceTransformer.encode, on N passages of about 200 words, batches of 32",
    )
    args = parser.parse_args()
    if args.throughput:
        throughput(args.throughput)
        return

    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("DATABASE_URL", None)
    work = Path(tempfile.mkdtemp(prefix="django_rag_command_timing_"))
    data_dir = args.data_dir or work / "pgdata"
    project = work / "project"
    make_project(project, data_dir)
    code = subprocess.run(
        [sys.executable, "-c", "import django_rag; print(django_rag.__file__)"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    python = sys.executable

    from django_rag.embedded import server_package

    # This process holds the server (stopped at the end); the commands reuse it.
    data_dir.mkdir(parents=True, exist_ok=True)
    server = server_package().get_server(data_dir, cleanup_mode="stop")
    try:
        setup = [
            [python, "manage.py", "migrate", "-v", "0"],
            *[
                [python, "manage.py", "rag_ingest", str(work / f"doc{i}.txt")]
                for i in range(len(DOCUMENTS))
            ],
        ]
        for i, text in enumerate(DOCUMENTS):
            (work / f"doc{i}.txt").write_text(text + "\n")
        for command in setup:
            subprocess.run(command, cwd=project, env=env, check=True, capture_output=True)

        query = "how long do refunds take"
        commands = {
            'python -c "import torch"': lambda run: [python, "-c", "import torch"],
            'python -c "import sentence_transformers"': lambda run: [
                python,
                "-c",
                "import sentence_transformers",
            ],
            "rag_search --mode fulltext": lambda run: [
                python, "manage.py", "rag_search", query, "--mode", "fulltext",
            ],
            "rag_search --mode semantic --json": lambda run: [
                python, "manage.py", "rag_search", query, "--mode", "semantic", "--json",
            ],
            "rag_search --mode semantic --collection missing": lambda run: [
                python, "manage.py", "rag_search", query, "--mode", "semantic",
                "--collection", "missing",
            ],
            "rag_ingest small.txt": lambda run: [
                python, "manage.py", "rag_ingest", str(small_file(work, run)),
            ],
        }  # fmt: skip
        samples: dict[str, list[dict]] = {name: [] for name in commands}
        for run in range(args.runs):
            # Interleaved, so a change of machine load touches every command alike.
            for name, build in commands.items():
                samples[name].append(timed(build(run), project, env))
    finally:
        server.cleanup()
        if args.data_dir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"django_rag: {code}")
    print(f"python: {sys.version.split()[0]}; runs: {args.runs}; load: {_loadavg()}")
    print(f"{'command':<50} {'wall s':>8} {'CPU s':>8}  exit  first stderr line")
    for name, rows in samples.items():
        wall = statistics.median(r["wall"] for r in rows)
        cpu = statistics.median(r["cpu"] for r in rows)
        codes = sorted({r["returncode"] for r in rows})
        note = rows[-1]["stderr"][0][:60] if rows[-1]["stderr"] else ""
        print(f"{name:<50} {wall:>8.2f} {cpu:>8.2f}  {codes}  {note}")
    if args.json:
        print(json.dumps({"code": code, "samples": samples}, indent=2))


def throughput(count: int) -> None:
    """Document embedding speed: the light encoder must not slow ingestion down."""
    import random

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from django_rag.embeddings.bert import BertSentenceEncoder
    from django_rag.embeddings.sentence_transformers import _resolve_path

    path = _resolve_path("all-MiniLM-L6-v2")
    words = small_file(Path(tempfile.mkdtemp()), 0).read_text().split()
    rng = random.Random(0)
    passages = [
        " ".join(rng.choice(words) for _ in range(rng.randint(120, 220))) for _ in range(count)
    ]
    ours, theirs = BertSentenceEncoder(path), SentenceTransformer(path, device="cpu")
    ours.encode(passages[:32])
    theirs.encode(passages[:32], batch_size=32, show_progress_bar=False)
    rates = {}
    for name, encode in (
        ("django_rag encoder (torch batches)", lambda: ours.encode(passages, batch_size=32)),
        (
            "SentenceTransformer.encode",
            lambda: theirs.encode(
                passages, batch_size=32, normalize_embeddings=True, show_progress_bar=False
            ),
        ),
    ):
        start = time.perf_counter()
        vectors = encode()
        rates[name] = (count / (time.perf_counter() - start), np.asarray(vectors))
    (a, va), (b, vb) = rates.values()
    print(f"{count} passages of 120-220 words, batches of 32; load: {_loadavg()}")
    for name, (rate, _) in rates.items():
        print(f"{name:<40} {rate:8.1f} passages/s")
    print(f"max abs difference of the vectors: {float(np.abs(va - vb).max()):.2e}")


def small_file(work: Path, run: int) -> Path:
    path = work / f"small{run}.txt"
    paragraph = textwrap.dedent(
        f"""\
        Note {run}: returns are accepted for thirty days after delivery. Items must be unused
        and in their original packaging, with the receipt or order number. Once the parcel
        reaches the warehouse it is inspected, usually within two days, and the refund goes
        back to the original payment method. Bank transfers can take another three to five
        days to appear. Gift cards are refunded as store credit. Sale items marked final
        cannot be returned, but they can still be exchanged for another size when stock
        allows. Shipping costs are refunded only when the item arrived damaged or was not
        the one ordered; in that case we also send a prepaid label by email.
        """
    )
    path.write_text(paragraph * 2)
    return path


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
