"""OCR of scanned PDF pages: seconds per page, peak memory and words read, per resolution.

    python benchmarks/ocr.py                                  # ../shared/data/pdfs
    python benchmarks/ocr.py --pdfs DIR --dpi 100,150,200

Each PDF of the folder whose pages have no text layer is parsed by ``PdfParser`` with
``OCR="rapidocr"`` at each ``OCR_DPI``, in a fresh child process each time (so the model load
and the peak memory are the parse's own). Words read are checked against the words an
expected-text file lists (``--expect``; by default the first lines of the Docling sample's
ground truth, written below), as the share of expected words found. No database is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The sample's opening sentence as printed (docling-project/docling, tests/data/ocr): what a
# reader sees on the page.
EXPECTED = (
    "Docling bundles PDF document conversion to JSON and Markdown in an easy self contained package"
)


def child(path: str, dpi: int) -> None:
    """Parse one file and print a JSON line (run in a child process)."""
    import django
    from django.conf import settings

    settings.configure(DJANGO_RAG={"OCR": "rapidocr", "OCR_DPI": dpi, "PARSE_TIMEOUT": None})
    django.setup()
    from django_rag.ingestion.parsers import parse_bytes

    data = Path(path).read_bytes()
    start = time.perf_counter()
    parsed = parse_bytes(data, filename=Path(path).name)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak": peak,
                "pages": len(parsed.metadata.get("ocr_pages", [])),
                "text": parsed.text,
            }
        )
    )


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pdfs", type=Path, default=ROOT.parent / "shared" / "data" / "pdfs")
    parser.add_argument("--dpi", default="100,150,200")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    import pymupdf

    scans = []
    for path in sorted(args.pdfs.glob("*.pdf")):
        try:
            with pymupdf.open(path) as document:
                if document.needs_pass:
                    continue
                if all(not page.get_text().strip() for page in document):
                    scans.append((path, document.page_count))
        except Exception:
            continue
    expected = words(EXPECTED)
    print(
        "Timings under load (shared 2-core machine); a fresh process per run (model load included).\n"
    )
    print("| file | pages | OCR_DPI | seconds | peak RSS | expected words found | characters |")
    print("|---|---|---|---|---|---|---|")
    for path, pages in scans:
        for dpi in [int(d) for d in args.dpi.split(",")]:
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(path), str(dpi)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            found = set(words(result["text"]))
            share = sum(word in found for word in expected) / len(expected)
            print(
                f"| {path.name} | {pages} | {dpi} | {result['seconds']:.1f} | "
                f"{result['peak'] / 2**20:.0f} MiB | {share:.0%} | {len(result['text']):,} |"
            )
        print(f"\nText read at {dpi} dpi:\n\n```text\n{result['text'][:600]}\n```")


if __name__ == "__main__":
    main()
