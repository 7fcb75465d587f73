"""Spreadsheets: XLSX read with openpyxl (the ``xlsx`` extra) and CSV read with the standard
library. Each sheet becomes a section (a "page" numbered from 1) holding a ``## Sheet name``
heading and a Markdown table whose first row is the sheet's first non-empty row (its header)."""

from __future__ import annotations

import csv
import datetime
import re
from collections.abc import Iterable, Iterator
from typing import Any

from ...exceptions import CorruptFile, DocumentTooLarge, RagError
from .base import ParsedDocument, Parser, check_input_size, decode_text
from .common import TextBuilder, check_ooxml, header_rule, require, table_row
from .text import TextParser


def cell_value(value: Any) -> str:
    """A cell as text: dates in ISO 8601, whole floats without ".0", the rest as ``str``."""
    if value is None:
        return ""
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        if isinstance(value, datetime.datetime) and value.time() == datetime.time():
            return value.date().isoformat()
        return value.isoformat()
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def add_table(builder: TextBuilder, rows: Iterable[Iterable[Any]]) -> int:
    """Add ``rows`` as a Markdown table, one row at a time (so the budgets are checked as it
    grows): empty rows skipped, trailing empty cells dropped, every row padded to the header's
    width (or cut to the widest row seen). Returns the number of data rows."""
    width = 0
    count = 0
    for raw in rows:
        builder.check_time()  # also for runs of empty rows, which add nothing
        cells = [cell_value(value) for value in raw]
        while cells and not cells[-1].strip():
            cells.pop()
        if not cells:
            continue
        if not width:  # the header
            width = len(cells)
            builder.add(table_row(cells) + "\n" + header_rule(width))
            continue
        if len(cells) > width:
            # A data row wider than the header: the extra cells join the last column, so
            # nothing is lost and the table keeps its shape.
            cells = [*cells[: width - 1], " ".join(cells[width - 1 :])]
        builder.add(table_row(cells + [""] * (width - len(cells))), tight=True)
        count += 1
    return count


class XlsxParser(Parser):
    """An Excel workbook (.xlsx, .xlsm): one section per worksheet, in workbook order, with
    the cells' values (for formulas, the value Excel last computed and saved). Charts, images,
    comments, formatting and hidden sheets' visibility are ignored (hidden sheets are read)."""

    requires = (("openpyxl", "xlsx", "openpyxl"),)

    content_type = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    format = "markdown"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        openpyxl = require("openpyxl", "xlsx", "Reading Excel (.xlsx) files")
        verified = check_ooxml(data, filename=filename, required="xl/workbook.xml")
        builder = TextBuilder(filename, what="sheet")
        try:
            workbook = openpyxl.load_workbook(verified, read_only=True, data_only=True)
        except RagError:
            raise
        except Exception as exc:
            raise CorruptFile(
                f"{filename} could not be read as an Excel workbook ({exc}); it may be damaged "
                "or saved in another format (.xls files must be converted to .xlsx first).",
                filename=filename,
            ) from exc
        sheets: list[str] = []
        try:
            for number, sheet in enumerate(workbook.worksheets, start=1):
                if not hasattr(sheet, "iter_rows"):
                    continue  # a chart sheet
                builder.start_page(number)
                name = " ".join(str(sheet.title).split())[:200]
                sheets.append(name)
                builder.add(f"## {name}")
                # The sheet's declared size (its <dimension>) is not trusted: each row is as
                # wide as its cells.
                sheet.reset_dimensions()
                add_table(builder, sheet.iter_rows(values_only=True))
        except RagError:
            raise
        except Exception as exc:
            raise CorruptFile(
                f"{filename} is damaged: reading its sheets failed ({exc}).", filename=filename
            ) from exc
        finally:
            workbook.close()
        properties = workbook.properties
        metadata: dict[str, Any] = {"sheets": sheets}
        if properties is not None and properties.creator:
            metadata["author"] = str(properties.creator)[:500]
        title = str(properties.title or "") if properties is not None else ""
        return builder.result(
            format=self.format,
            content_type=self.content_type,
            title=title.strip()[:500],
            metadata=metadata,
        )


_DELIMITERS = ",;\t|"


def guess_delimiter(text: str) -> str:
    """The delimiter of a CSV file: whichever of comma, semicolon, tab and pipe occurs most
    often outside quotes in its first line (a comma when none does). Linear in that line."""
    quoted = False
    counts = dict.fromkeys(_DELIMITERS, 0)
    for char in text:
        if char == '"':
            quoted = not quoted
        elif not quoted and char in "\r\n":
            break
        elif not quoted and char in counts:
            counts[char] += 1
    best = max(_DELIMITERS, key=lambda d: counts[d])
    return best if counts[best] else ","


# The most characters one CSV row (the lines one record spans) may have. Longer rows are refused
# before the csv module reads them: a row becomes a list of its fields, about 60 bytes each, so a
# 30 MB line of one-letter fields took 750 MB and 16 s before MAX_DOCUMENT_CHARS could refuse it.
MAX_CSV_ROW_CHARS = 1024 * 1024
# Where a line ends for the csv module (what io.StringIO(newline="") splits at).
_LINE_END = re.compile(r"\r\n|\r|\n")


class _BoundedLines:
    """The lines of ``text``, each handed over only while the row being read stays within
    ``limit`` characters: the row is refused before the csv module sees the line that would
    take it past (the caller calls :meth:`row_done` after each row)."""

    def __init__(self, text: str, *, limit: int, filename: str):
        self.text = text
        self.limit = limit
        self.filename = filename
        self.row_chars = 0
        self.lines = 0

    def row_done(self) -> None:
        self.row_chars = 0

    def __iter__(self) -> Iterator[str]:
        text, position, length = self.text, 0, len(self.text)
        while position < length:
            match = _LINE_END.search(text, position)
            end = match.end() if match else length
            self.lines += 1
            self.row_chars += end - position
            if self.row_chars > self.limit:
                raise DocumentTooLarge(
                    f"{self.filename}: the row reaching line {self.lines:,} is longer than "
                    f"{self.limit:,} characters, so it was refused before it was read (a row "
                    "becomes a list of its fields: one this long can take gigabytes). Split "
                    "the row, or ingest the file as text (.txt).",
                    filename=self.filename,
                    line=self.lines,
                    limit=self.limit,
                )
            yield text[position:end]
            position = end


class CsvParser(TextParser):
    """A CSV (or TSV) file as one Markdown table, its first row the header. UTF-8 (with or
    without BOM) or BOM-marked UTF-16, like text files; the delimiter is guessed from the
    first line (comma, semicolon, tab or pipe). A row longer than ``MAX_CSV_ROW_CHARS``
    characters is refused (:class:`DocumentTooLarge`) before it is read."""

    content_type = "text/csv"
    format = "markdown"

    def parse(self, data: bytes, *, filename: str) -> ParsedDocument:
        check_input_size(self, len(data), filename=filename)
        text = decode_text(data, filename=filename)
        if filename.lower().endswith(".tsv"):
            delimiter = "\t"
        else:
            delimiter = guess_delimiter(text[: MAX_CSV_ROW_CHARS + 1])
        builder = TextBuilder(filename)
        lines = _BoundedLines(text, limit=MAX_CSV_ROW_CHARS, filename=filename)
        reader = csv.reader(lines, delimiter=delimiter)

        def rows() -> Iterator[list[str]]:
            for row in reader:
                yield row
                lines.row_done()

        try:
            count = add_table(builder, rows())
        except csv.Error as exc:
            raise CorruptFile(
                f"{filename} is not valid CSV at line {reader.line_num} ({exc}). A field longer "
                f"than {csv.field_size_limit():,} characters usually means an unclosed quote; "
                "fix the file or ingest it as text.",
                filename=filename,
                line=reader.line_num,
            ) from exc
        return builder.result(
            format=self.format,
            content_type=self.content_type,
            metadata={"rows": count, "delimiter": delimiter},
        )
