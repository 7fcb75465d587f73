"""Parse throughput of the office, web and mail formats, and the PDF table finder on real PDFs.

    python benchmarks/formats.py                         # ../shared/data/pdfs for the tables
    python benchmarks/formats.py --data DIR --json       # another folder of PDFs; JSON out
    python benchmarks/formats.py --scale 2               # larger generated files

Throughput: one file per format is generated with the library that reads it (HTML by hand,
DOCX with python-docx, PPTX with python-pptx, XLSX with openpyxl, CSV with the csv module, EML
with the email package and a PDF attachment), of a few MB of text, and parsed by
``parse_bytes`` (the parser registry, budgets on) three times; the best time is reported as
input MB/s, pages (slides, sheets) or rows per second and characters of text per second.

Tables: every PDF of the folder is parsed with ``PDF_TABLES`` on and off. For each, the tables
written, the time with and without the finder, and two checks on every table written:
*well-formed* (every row has the header's number of cells) and *grounded* (every word of its
cells occurs in the prose-only text of the same PDF: the finder invents nothing). The files the
folder's README describes as holding tables are marked, so a table missed shows.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import re
import sys
import time
from email.message import EmailMessage
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

# The files of ../shared/data/pdfs that hold data tables, from its README.
KNOWN_TABLES = {
    "gov_fbi_nics_wide_table.pdf",
    "gov_senate_expenditures_table.pdf",
    "latex_two_column_lipsum_with_table_3p.pdf",
    "paper_data_in_brief_tables_images_1p.pdf",
    "paper_dpr_two_column_13p.pdf",
    "paper_otsl_2305.03393_page9_tables.pdf",
}
WORDS = ["refund", "policy", "bicycle", "delivery", "warehouse", "invoice", "customer", "route"]
WORD = re.compile(r"\w+")


def configure(**rag) -> None:
    from django.conf import settings

    if not settings.configured:
        settings.configure(DJANGO_RAG=rag)
        import django

        django.setup()


def sentence(i: int) -> str:
    words = [WORDS[(i * 7 + k) % len(WORDS)] for k in range(12)]
    return f"Paragraph {i}: " + " ".join(words) + "."


def make_html(n: int) -> bytes:
    body = "".join(
        (f"<h2>Section {i}</h2>" if i % 10 == 0 else "") + f"<p>{sentence(i)}</p>" for i in range(n)
    )
    nav = "<nav><a href='/'>Home</a><a href='/shop'>Shop</a></nav>"
    return (
        f"<html><head><title>Bench</title></head><body>{nav}<article><h1>Bench</h1>"
        f"{body}</article><footer>Footer</footer></body></html>"
    ).encode()


def make_docx(n: int) -> bytes:
    import docx

    document = docx.Document()
    for i in range(n):
        if i % 10 == 0:
            document.add_heading(f"Section {i}", level=2)
        document.add_paragraph(sentence(i))
        if i % 50 == 49:
            table = document.add_table(rows=0, cols=3)
            for r in range(10):
                for cell, value in zip(table.add_row().cells, ("a", str(r), "b"), strict=True):
                    cell.text = value
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def make_pptx(slides: int) -> bytes:
    import pptx

    deck = pptx.Presentation()
    for i in range(slides):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = f"Slide {i}"
        body = slide.placeholders[1].text_frame
        body.text = sentence(i)
        for k in range(4):
            body.add_paragraph().text = sentence(i + k + 1)
        slide.notes_slide.notes_text_frame.text = sentence(i + 9)
    buffer = io.BytesIO()
    deck.save(buffer)
    return buffer.getvalue()


def make_xlsx(rows: int, sheets: int = 4) -> bytes:
    import openpyxl

    workbook = openpyxl.Workbook()
    workbook.remove(workbook.active)
    for s in range(sheets):
        sheet = workbook.create_sheet(f"Sheet {s}")
        sheet.append(["id", "customer", "amount", "date", "note"])
        for r in range(rows // sheets):
            sheet.append(
                [r, f"customer {r % 97}", r * 1.5, datetime.date(2026, 1, 1 + r % 28), sentence(r)]
            )
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


def make_csv(rows: int) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["id", "customer", "amount", "note"])
    for r in range(rows):
        writer.writerow([r, f"customer {r % 97}", r * 1.5, sentence(r)])
    return buffer.getvalue().encode()


def make_pdf(pages: list[str]) -> bytes:
    import pymupdf

    document = pymupdf.open()
    for text in pages:
        document.new_page().insert_textbox(pymupdf.Rect(50, 50, 550, 800), text, fontsize=10)
    data = document.tobytes()
    document.close()
    return data


def make_eml(n: int) -> bytes:
    message = EmailMessage()
    message["From"] = "a@example.org"
    message["To"] = "b@example.org"
    message["Subject"] = "Bench"
    message.set_content("\n\n".join(sentence(i) for i in range(n)))
    pages = [" ".join(sentence(i * 20 + k) for k in range(20)) for i in range(max(1, n // 200))]
    message.add_attachment(make_pdf(pages), maintype="application", subtype="pdf", filename="a.pdf")
    return bytes(message)


def throughput(scale: float) -> list[dict]:
    from django_rag.ingestion.parsers import parse_bytes

    cases = [
        ("html", ".html", lambda: make_html(int(20_000 * scale)), None),
        ("docx", ".docx", lambda: make_docx(int(10_000 * scale)), None),
        ("pptx", ".pptx", lambda: make_pptx(int(300 * scale)), "slides"),
        ("xlsx", ".xlsx", lambda: make_xlsx(int(20_000 * scale)), "sheets"),
        ("csv", ".csv", lambda: make_csv(int(50_000 * scale)), "rows"),
        ("eml", ".eml", lambda: make_eml(int(10_000 * scale)), None),
    ]
    results = []
    for name, extension, build, unit in cases:
        data = build()
        best = None
        parsed = None
        for _ in range(3):
            started = time.perf_counter()
            parsed = parse_bytes(data, filename="bench" + extension)
            elapsed = time.perf_counter() - started
            best = elapsed if best is None else min(best, elapsed)
        count = {
            "slides": len(parsed.pages),
            "sheets": len(parsed.pages),
            "rows": parsed.metadata.get("rows", 0),
        }.get(unit or "", 0)
        results.append(
            {
                "format": name,
                "input_mb": round(len(data) / 1e6, 2),
                "text_chars": len(parsed.text),
                "seconds": round(best, 3),
                "mb_per_s": round(len(data) / 1e6 / best, 2),
                "chars_per_s": round(len(parsed.text) / best),
                "units": f"{count / best:,.0f} {unit}/s" if unit else "",
            }
        )
    return results


def _table_blocks(text: str) -> list[list[str]]:
    from django_rag.ingestion.chunkers import markdown_tables

    return [text[t.start : t.end].splitlines() for t in markdown_tables(text)]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def tables(folder: Path) -> list[dict]:
    from django.test import override_settings

    from django_rag.exceptions import RagError
    from django_rag.ingestion.parsers import parse_file

    rows = []
    for path in sorted(folder.glob("*.pdf")):
        try:
            with override_settings(DJANGO_RAG={"PDF_TABLES": False, "PARSE_TIMEOUT": None}):
                started = time.perf_counter()
                prose = parse_file(path)
                plain_seconds = time.perf_counter() - started
            with override_settings(DJANGO_RAG={"PDF_TABLES": True, "PARSE_TIMEOUT": None}):
                started = time.perf_counter()
                parsed = parse_file(path)
                table_seconds = time.perf_counter() - started
        except RagError as exc:
            rows.append({"file": path.name, "error": exc.code})
            continue
        prose_words = set(WORD.findall(prose.text.lower()))
        found = _table_blocks(parsed.text)
        well_formed = grounded = 0
        for block in found:
            widths = {len(_cells(line)) for line in block}
            well_formed += len(widths) == 1
            words = {w for line in block[2:] + block[:1] for w in WORD.findall(line.lower())}
            grounded += words <= prose_words
        rows.append(
            {
                "file": path.name,
                "pages": len(parsed.pages),
                "known_tables": path.name in KNOWN_TABLES,
                "tables": len(found),
                "well_formed": well_formed,
                "grounded": grounded,
                "seconds_prose": round(plain_seconds, 2),
                "seconds_tables": round(table_seconds, 2),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "pdfs")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    configure(PARSE_TIMEOUT=None)
    result = {"throughput": throughput(args.scale)}
    if args.data.is_dir():
        result["tables"] = tables(args.data)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print("format  input MB  text chars  seconds  MB/s  chars/s  units")
    for row in result["throughput"]:
        print(
            f"{row['format']:<7} {row['input_mb']:>8} {row['text_chars']:>11,} {row['seconds']:>8}"
            f" {row['mb_per_s']:>5} {row['chars_per_s']:>8,}  {row['units']}"
        )
    if "tables" in result:
        print("\nfile | pages | README says tables | tables | well-formed | grounded | s prose | s")
        for row in result["tables"]:
            if "error" in row:
                print(f"{row['file']} | {row['error']}")
                continue
            print(
                f"{row['file']} | {row['pages']} | {'yes' if row['known_tables'] else ''} | "
                f"{row['tables']} | {row['well_formed']} | {row['grounded']} | "
                f"{row['seconds_prose']} | {row['seconds_tables']}"
            )


if __name__ == "__main__":
    main()
