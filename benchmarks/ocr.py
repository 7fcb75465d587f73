"""OCR of scanned PDF pages: seconds per page, peak memory and words read, per resolution.

    python benchmarks/ocr.py                                  # ../shared/data/pdfs
    python benchmarks/ocr.py --pdfs DIR --dpi 100,150,200
    python benchmarks/ocr.py --images --dpi 150,300            # the same pages as image files

Each PDF of the folder whose pages have no text layer is parsed by ``PdfParser`` with
``OCR="rapidocr"`` at each ``OCR_DPI``, in a fresh child process each time (so the model load
and the peak memory are the parse's own). Words read are checked against the words an
expected-text file lists (``--expect``; by default the first lines of the Docling sample's
ground truth, written below), as the share of expected words found. No database is needed.

With ``--images``, each scanned page is first rendered (pymupdf) to a PNG and a JPEG file at
each ``--dpi``, and those files are parsed by ``ImageParser`` instead: the image-file path
through the same OCR.
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
    parser.add_argument("--images", action="store_true", help="parse the pages as image files")
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
    if args.images:
        images(scans, [int(d) for d in args.dpi.split(",")], expected)
        return
    print("| file | pages | OCR_DPI | seconds | peak RSS | expected words found | characters |")
    print("|---|---|---|---|---|---|---|")
    for path, pages in scans:
        for dpi in [int(d) for d in args.dpi.split(",")]:
            result = run_child(path, dpi)
            found = set(words(result["text"]))
            share = sum(word in found for word in expected) / len(expected)
            print(
                f"| {path.name} | {pages} | {dpi} | {result['seconds']:.1f} | "
                f"{result['peak'] / 2**20:.0f} MiB | {share:.0%} | {len(result['text']):,} |"
            )
        print(f"\nText read at {dpi} dpi:\n\n```text\n{result['text'][:600]}\n```")


def run_child(path: Path, dpi: int) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(path), str(dpi)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def images(scans: list, dpis: list[int], expected: list[str]) -> None:
    """Each scanned page rendered to PNG and JPEG files at each dpi, parsed by ImageParser."""
    import tempfile

    import pymupdf

    print("| page | file | pixels | bytes | seconds | peak RSS | expected words found |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for path, _pages in scans:
            with pymupdf.open(path) as document:
                page = document[0]
                for dpi in dpis:
                    pixmap = page.get_pixmap(dpi=dpi, alpha=False)
                    for kind in ("png", "jpg"):
                        target = Path(folder) / f"{path.stem}-{dpi}dpi.{kind}"
                        if kind == "jpg":
                            pixmap.save(str(target), jpg_quality=85)
                        else:
                            pixmap.save(str(target))
                        result = run_child(target, dpi)
                        found = set(words(result["text"]))
                        share = sum(word in found for word in expected) / len(expected)
                        print(
                            f"| {path.name} p1 at {dpi} dpi | {kind.upper()} | "
                            f"{pixmap.width} x {pixmap.height} | {target.stat().st_size:,} | "
                            f"{result['seconds']:.1f} | {result['peak'] / 2**20:.0f} MiB | "
                            f"{share:.0%} |"
                        )


if __name__ == "__main__":
    main()
