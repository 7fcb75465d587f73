"""Peak memory of parsing hostile PDFs and ZIPs, each in a fresh process.

    python benchmarks/pdf_bomb.py                       # every case, 8 GiB address-space fence
    python benchmarks/pdf_bomb.py --case cmap --limit-gb 4
    python benchmarks/pdf_bomb.py --case cmap --codes 1000000

Each case runs ``parse_bytes`` in a child process (``python -c``) and reports the outcome (the
error's code, or the characters parsed), the child's CPU seconds and its peak resident memory
(``VmHWM``; ``ru_maxrss`` of a child of a large process would report the parent's peak). The
child's address space is limited (``--limit-gb``) so a case that would take the machine's memory
stops there instead: its outcome then shows how it failed (``MemoryError``, ``corrupt_file``
when MuPDF's allocation failed, or the signal that killed it).

Cases (built by ``tests/test_parsers_hostile.py``):

- ``cmap``: one page shows the code 0x01 ``--codes`` times (default 4 million) in a font whose
  ToUnicode CMap maps it to 128 characters: a 5 KB PDF;
- ``content``: ``bomb_pdf()``, one page whose content stream inflates to 200 MB;
- ``zip``: a DOCX-shaped ZIP whose ``word/document.xml`` inflates to 200 MB, read by a parser
  that goes through :func:`django_rag.ingestion.archives.open_zip`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, resource, sys, time
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
from django.conf import settings
settings.configure(DJANGO_RAG={"PARSERS": {".docx": "tests.test_parsers_hostile.DocxTextParser"}})
from tests import test_parsers_hostile as hostile
from django_rag.ingestion.parsers import parse_bytes
case, codes = sys.argv[1], int(sys.argv[2])
if case == "cmap":
    data, name = hostile.cmap_bomb_pdf(codes), "bomb.pdf"
elif case == "content":
    data, name = hostile.bomb_pdf(), "bomb.pdf"
else:
    data, name = hostile.docx_bomb(), "bomb.docx"
started = time.process_time()
try:
    outcome = f"parsed {len(parse_bytes(data, filename=name).text):,} characters"
except BaseException as exc:
    outcome = getattr(exc, "code", type(exc).__name__)
print(json.dumps({
    "case": case,
    "bytes": len(data),
    "outcome": outcome,
    "cpu_seconds": round(time.process_time() - started, 3),
    "peak_mb": next(
        int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")
    ) // 1024,
}))
"""


def run(case: str, codes: int, limit: int) -> dict:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(codes), str(limit)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    wall = round(time.perf_counter() - started, 2)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        reason = f"signal {-proc.returncode}" if proc.returncode < 0 else proc.stderr[-300:]
        return {"case": case, "outcome": f"child died ({reason})", "wall_seconds": wall}
    return {**json.loads(lines[-1]), "wall_seconds": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=["cmap", "content", "zip"], action="append")
    parser.add_argument("--codes", type=int, default=4_000_000)
    parser.add_argument("--limit-gb", type=float, default=8.0)
    args = parser.parse_args()
    limit = int(args.limit_gb * (1 << 30))
    for case in args.case or ["cmap", "content", "zip"]:
        print(json.dumps(run(case, args.codes, limit)), flush=True)


if __name__ == "__main__":
    main()
