"""Property-based tests of the hand-written parts of the format parsers: the CSV delimiter
guess, Markdown table cells (one line, pipes escaped, whatever the cell) and the table shape
the spreadsheet parsers produce."""

from __future__ import annotations

import csv
import io
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from django_rag.ingestion.parsers import parse_bytes
from django_rag.ingestion.parsers.common import cell_text, markdown_table
from django_rag.ingestion.parsers.spreadsheet import guess_delimiter

UNESCAPED_PIPE = re.compile(r"(?<!\\)(?:\\\\)*\|")

header_cell = st.text(alphabet=st.characters(categories=["L", "N"]) | st.just(" "), min_size=1)
any_cell = st.text(max_size=30)


def split_row(line: str) -> list[str]:
    """Cells of a Markdown table row, read as GitHub-flavoured Markdown does: a cell ends at
    " | " unless the pipe follows an odd run of backslashes (an escaped pipe); a run of
    backslashes before a pipe stands for half as many."""
    assert line.startswith("| ") and line.endswith(" |")
    body = line[2:-2]
    cells, current, index = [], [], 0
    for match in re.finditer(r"(\\*)\|", body):
        current.append(body[index : match.start()])
        slashes = len(match.group(1))
        current.append("\\" * (slashes // 2))
        if slashes % 2:
            current.append("|")
        else:
            text = "".join(current)
            assert text.endswith(" "), line  # " | " separates cells
            cells.append(text[:-1])
            current = []
            if body.startswith(" ", match.end()):
                index = match.end() + 1
                continue
        index = match.end()
    current.append(body[index:])
    cells.append("".join(current))
    return cells


@given(st.sampled_from(",;\t|"), st.lists(header_cell, min_size=2, max_size=6))
def test_the_delimiter_of_a_written_csv_is_found(delimiter, header):
    buffer = io.StringIO()
    csv.writer(buffer, delimiter=delimiter).writerow(header)
    assert guess_delimiter(buffer.getvalue()) == delimiter


@given(any_cell)
def test_a_cell_is_one_line_and_reads_back_as_its_words(value):
    text = cell_text(value)
    assert "\n" not in text and "\r" not in text
    assert split_row(f"| {text} |") == [" ".join(value.split())]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(",;\t"),
    # Two columns at least: a one-column file has no delimiter to guess from.
    st.lists(header_cell, min_size=2, max_size=5),
    st.lists(st.lists(any_cell, min_size=0, max_size=7), max_size=8),
)
def test_a_csv_becomes_a_table_of_the_header_width_with_every_cell(delimiter, header, rows):
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter=delimiter)
    writer.writerow(header)
    writer.writerows(rows)
    parsed = parse_bytes(buffer.getvalue().encode(), filename="p.csv")
    lines = parsed.text.splitlines()
    width = len(header)
    assert split_row(lines[0]) == [" ".join(cell.split()) for cell in header]
    assert lines[1] == "|" + "---|" * width
    kept = []
    for row in rows:
        cells = [" ".join(cell.split()) for cell in row]
        while cells and not cells[-1]:
            cells.pop()
        if cells:
            kept.append(cells)
    assert len(lines) == 2 + len(kept)
    for line, cells in zip(lines[2:], kept, strict=True):
        read = split_row(line)
        assert len(read) == width
        # Every word of the row is in the table row, in order (extra cells join the last).
        assert " ".join(" ".join(read).split()) == " ".join(" ".join(cells).split())


@given(st.lists(st.lists(any_cell, max_size=5), max_size=6))
def test_markdown_tables_have_one_width(rows):
    table = markdown_table(rows)
    if not table:
        return
    widths = {len(split_row(line)) for line in table.splitlines() if not line.startswith("|-")}
    assert len(widths) == 1
