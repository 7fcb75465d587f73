"""PDF text as prose: de-hyphenation, wrapped lines, reading order, exact page ranges.

The PDFs are built here with pymupdf, line by line in a monospaced font, so every line break,
hyphen and column is where the test puts it. Search tests ingest them through the real path
(parse, chunk, embed, store in PostgreSQL) and query PostgreSQL's full-text search.
"""

import sys
import textwrap

import pymupdf
import pytest

import django_rag as rag
from django_rag.ingestion import pdftext
from django_rag.ingestion.parsers import parse_bytes
from django_rag.ingestion.pdftext import Block, Line, page_text, reading_order

CHAR = 6.0  # Courier at 10 pt: every character is 6 pt wide
LEADING = 12.0
LEFT, RIGHT = 50.0, 320.0  # column x positions: 40 characters (240 pt) wide, a 30 pt gutter


def column(x: float, y: float, lines: list[str]) -> list[tuple[float, float, str]]:
    return [(x, y + index * LEADING, line) for index, line in enumerate(lines)]


def build_pdf(pages: list[list[tuple[float, float, str]]]) -> bytes:
    """One page per list of (x, baseline y, text), drawn in the order given."""
    document = pymupdf.open()
    for items in pages:
        page = document.new_page(width=612, height=792)
        for x, y, text in items:
            page.insert_text((x, y), text, fontname="cour", fontsize=10)
    data = document.tobytes()
    document.close()
    return data


def prose(text: str) -> str:
    return " ".join(text.split())


def parse(pages) -> str:
    return parse_bytes(build_pdf(pages), filename="built.pdf").text


# --- de-hyphenation ----------------------------------------------------------------------------


def test_a_word_hyphenated_at_a_line_end_is_made_whole():
    text = parse(
        [
            column(
                LEFT,
                72,
                [
                    "The measured effects were strongly asso-",
                    "ciated with the dose that each patient",
                    "received during the electroencephalo-",
                    "graphy sessions of the second week.",
                ],
            )
        ]
    )
    assert "associated" in text and "electroencephalography" in text
    assert "asso-" not in text and "ciated" not in text.replace("associated", "")
    assert prose(text) == (
        "The measured effects were strongly associated with the dose that each patient "
        "received during the electroencephalography sessions of the second week."
    )


@pytest.mark.parametrize(
    "lines, expected",
    [
        (["We compare it with the state-of-the-", "art models of last year."], "state-of-the-art"),
        (["Admissions rose during COVID-", "19 waves in both regions."], "COVID-19"),
        (["Die Zahl der EU-", "Staaten ist seitdem gestiegen."], "EU-Staaten"),
        (["A range of 10-", "20 percent was observed."], "10- 20"),  # not a word hyphen
        (["The cost was high -", "and nobody paid it."], "high - and"),  # a dash
    ],
)
def test_real_hyphens_are_kept(lines, expected):
    assert expected in prose(parse([column(LEFT, 72, lines)]))


def test_a_compound_printed_whole_elsewhere_keeps_its_hyphen():
    page_one = column(
        LEFT, 72, ["This is a well-known result and it", "holds for the dual-", "encoder as well."]
    )
    page_two = column(LEFT, 72, ["A dual-encoder maps questions first."])
    text = parse([page_one, page_two])
    assert "dual-encoder as well" in text and "dualencoder" not in text


def test_a_soft_hyphen_at_a_line_end_is_removed():
    assert "hyphenation works" in parse(
        [column(LEFT, 72, ["Soft hyphen\u00ad", "ation works."])]
    ).replace("hyphen\u00adation", "")


# --- lines and paragraphs ----------------------------------------------------------------------

PARAGRAPH = (
    "Retrieval quality depends on how the text is split into passages, and a passage that "
    "keeps every line break of the printed page reads like a list of fragments to the model."
)


def test_wrapped_lines_become_one_paragraph_and_short_lines_stay():
    lines = textwrap.wrap(PARAGRAPH, 40)
    items = column(LEFT, 72, lines)
    items += column(LEFT, 72 + (len(lines) + 2) * LEADING, ["Second paragraph here."])
    items += column(
        LEFT,
        72 + (len(lines) + 5) * LEADING,
        ["Shopping list:", "- apples", "* pears", "1. first step", "2. second step"],
    )
    text = parse([items])
    assert PARAGRAPH + "\n\nSecond paragraph here." in text
    assert "Shopping list:\n- apples\n* pears\n1. first step\n2. second step" in text


def test_a_paragraph_running_into_the_next_column_stays_one_paragraph():
    lines = textwrap.wrap(LEFT_STORY, 40)
    half = len(lines) // 2
    items = column(LEFT, 100, lines[:half]) + column(RIGHT, 100, lines[half:])
    items.append((LEFT, 700, "Footer text that also runs across the whole width of the page"))
    text = parse([items])
    assert LEFT_STORY in text  # one space where the column turned, no paragraph break
    assert lines[half - 1] + " " + lines[half] in text


def test_wrapped_chinese_lines_join_without_a_space():
    blocks = [
        Block(
            [
                Line("数据检索的质量取决于文本如何被切分成", 50, 100, 290, 110),
                Line("段落以及每个段落的长度。", 50, 112, 200, 122),
            ]
        )
    ]
    assert page_text(blocks).text == "数据检索的质量取决于文本如何被切分成段落以及每个段落的长度。"


def test_table_rows_stay_on_their_own_lines():
    rows = [["Country", "Capital"], ["France", "Paris"], ["Japan", "Tokyo"]]
    items = []
    for index, (left, right) in enumerate(rows):
        items += [(LEFT, 72 + index * LEADING, left), (LEFT + 200, 72 + index * LEADING, right)]
    assert "Country Capital\nFrance Paris\nJapan Tokyo" in parse([items])


# --- reading order -----------------------------------------------------------------------------

LEFT_STORY = (
    "The left column tells the first story about a lighthouse keeper who counted ships every "
    "night and wrote their names in a small green notebook that nobody ever read. In winter "
    "the storms kept the ships in harbour, so he counted gulls instead, and in spring he "
    "painted the railing white again."
)
RIGHT_STORY = (
    "The right column tells another story about a baker who rose before dawn to knead "
    "bread for the whole village and sang quietly while the ovens warmed. On market days "
    "she baked twice as much, and what was left at noon went to the school down the hill."
)


def two_column_page(interleaved: bool = True) -> list[tuple[float, float, str]]:
    """A title across both columns, two columns, and a footer across both: drawn row by row
    (left line, right line, ...) as some producers do, so MuPDF's own order interleaves."""
    left, right = textwrap.wrap(LEFT_STORY, 40), textwrap.wrap(RIGHT_STORY, 40)
    items = [(LEFT, 60, "A Title That Spans Both Columns Of This Page Entirely")]
    for index in range(max(len(left), len(right))):
        y = 100 + index * LEADING
        if index < len(left):
            items.append((LEFT, y, left[index]))
        if index < len(right):
            items.append((RIGHT, y, right[index]))
    if not interleaved:
        items = items[:1] + sorted(items[1:], key=lambda item: item[0])
    items.append((LEFT, 700, "Footer text that also runs across the whole width of the page"))
    return items


@pytest.mark.parametrize("interleaved", [True, False])
def test_two_columns_are_read_one_after_the_other(interleaved):
    text = prose(parse([two_column_page(interleaved)]))
    assert text.startswith("A Title That Spans Both Columns")
    assert LEFT_STORY in text and RIGHT_STORY in text
    assert text.index(LEFT_STORY) < text.index(RIGHT_STORY)
    assert text.endswith("across the whole width of the page")


def test_mupdf_order_interleaves_the_built_page():
    """The layout the column test fixes really is interleaved in MuPDF's own order."""
    document = pymupdf.open(stream=build_pdf([two_column_page()]), filetype="pdf")
    raw = prose(document[0].get_text("text"))
    assert LEFT_STORY not in raw


def test_a_single_column_page_keeps_its_order():
    blocks = [
        Block([Line("Second block drawn first", 50, 300, 290, 310)]),
        Block([Line("First block drawn second", 50, 100, 290, 110)]),
    ]
    assert reading_order(blocks) == blocks  # no gutter: the producer's order is kept


def test_a_table_is_not_taken_for_columns():
    # Cells sit in columns with wide gaps, but no column holds prose: order is kept.
    blocks = [
        Block([Line(text, x, y, x + 30, y + 10)])
        for y in range(100, 400, 12)
        for x, text in ((50, "12.5"), (200, "13.1"), (350, "9.8"))
    ]
    assert reading_order(blocks) == blocks


def test_right_to_left_columns_are_read_from_the_right():
    words = "مرحبا بكم في هذا النص العربي الطويل الذي يملأ السطر كله"
    right = Block([Line(words, 320, 100 + i * 12, 560, 110 + i * 12) for i in range(20)])
    left = Block([Line(words, 50, 100 + i * 12, 290, 110 + i * 12) for i in range(20)])
    assert reading_order([left, right]) == [right, left]


# --- page ranges -------------------------------------------------------------------------------


def test_page_spans_stay_exact_after_cleaning():
    pages = [
        column(LEFT, 72, ["Page one opens with a compound: the dual-", "encoder of page one."]),
        column(LEFT, 72, ["Page two prints dual-encoder whole,", "then ends with two."]),
        column(LEFT, 72, ["Page three ends the document here."]),
    ]
    parsed = parse_bytes(build_pdf(pages), filename="three.pdf")
    spans = [parsed.text[page.start : page.end] for page in parsed.pages]
    assert spans == [
        "Page one opens with a compound: the dual-encoder of page one.",
        "Page two prints dual-encoder whole, then ends with two.",
        "Page three ends the document here.",
    ]
    assert parsed.text == "\n\n".join(spans)


# --- full-text search through the real ingest path ---------------------------------------------


@pytest.mark.django_db
def test_fulltext_search_finds_words_split_across_lines():
    filler = textwrap.wrap("Nothing on this page mentions the measured sessions at all. " * 8, 40)
    split_page = column(
        LEFT,
        72,
        [
            "Patients attended weekly electroencepha-",
            "lography sessions, and the results were",
            "strongly asso-",
            "ciated with age.",
        ],
    )
    doc = rag.ingest_bytes(
        build_pdf([column(LEFT, 72, filler), split_page, two_column_page()]),
        filename="study.pdf",
        collection="pdf-text",
        chunk_size=40,
        chunk_overlap=0,
    )
    # Page boundaries found from the text itself, independently of the stored page spans.
    page_two = doc.content.index("Patients attended")
    page_three = doc.content.index("A Title That Spans")

    def page_of(offset):
        return 1 if offset < page_two else 2 if offset < page_three else 3

    for word in ("electroencephalography", "associated"):
        hits = rag.search(word, mode="fulltext", collection="pdf-text")
        assert hits, word
        assert word in hits[0].text
        chunk = doc.chunks.get(pk=hits[0].chunk_id)
        assert (hits[0].page_start, hits[0].page_end) == (
            page_of(chunk.start_char),
            page_of(chunk.end_char - 1),
        )
        assert page_of(doc.content.index(word)) == 2
    # The halves alone are not what was stored.
    assert not rag.search("lography", mode="fulltext", collection="pdf-text")
    # Columns: the chunk holding the lighthouse keeper's notebook holds no baker.
    (hit, *_) = rag.search("lighthouse notebook", mode="fulltext", collection="pdf-text")
    assert hit.page_start == 3 and "notebook" in hit.text and "baker" not in hit.text
    chunks = list(doc.chunks.order_by("chunk_index"))
    content = prose(doc.content)
    assert LEFT_STORY in content and content.index(LEFT_STORY) < content.index(RIGHT_STORY)
    for chunk in chunks:
        assert doc.content[chunk.start_char : chunk.end_char] == chunk.text
        assert (chunk.page_start, chunk.page_end) == (
            page_of(chunk.start_char),
            page_of(chunk.end_char - 1),
        )


def test_pages_over_the_layout_limit_keep_mupdf_plain_text(monkeypatch):
    from django_rag.ingestion import parsers

    lines = ["The measured effects were strongly asso-", "ciated with the dose."]
    monkeypatch.setattr(parsers.pdf, "MAX_LAYOUT_CHARS", 20)
    assert parse([column(LEFT, 72, lines)]) == "\n".join(lines)
    monkeypatch.setattr(parsers.pdf, "MAX_LAYOUT_CHARS", 10_000)
    assert "associated" in parse([column(LEFT, 72, lines)])


# --- linear work on hostile layouts --------------------------------------------------------------


def count_lines(function, *args) -> int:
    """Python lines executed in pdftext while ``function(*args)`` runs: a measure of work that
    does not depend on the machine's speed or load."""
    executed = 0
    module_file = pdftext.__file__

    def tracer(frame, event, arg):
        nonlocal executed
        if frame.f_code.co_filename != module_file:
            return None
        if event == "line":
            executed += 1
        return tracer

    sys.settrace(tracer)
    try:
        function(*args)
    finally:
        sys.settrace(None)
    return executed


def hostile_block(kind: str, n: int) -> list[Block]:
    if kind == "hyphen-chain":  # every line ends in a hyphen and continues lowercase
        lines = ["a-"] * n
    elif kind == "compound-chain":  # hyphens inside and at the end of every line
        lines = ["a-b-c-d-"] * n
    elif kind == "dashes":
        lines = ["-"] * n
    elif kind == "bullets":
        lines = ["• • • •"] * n
    elif kind == "one-long-line":
        lines = ["a-" * (50 * n)]
    else:  # long lines without spaces, hyphenated
        lines = ["x" * 200 + "-"] * n
    return [
        Block([Line(text, 50, 100 + i * 12, 290, 110 + i * 12) for i, text in enumerate(lines)])
    ]


@pytest.mark.parametrize(
    "kind",
    ["hyphen-chain", "compound-chain", "dashes", "bullets", "one-long-line", "long-words"],
)
def test_cleaning_does_linear_work_on_pathological_lines(kind):
    def clean(blocks):
        page_text(blocks)
        pdftext.hyphenated_words(blocks, set())

    small = count_lines(clean, hostile_block(kind, 2_000))
    large = count_lines(clean, hostile_block(kind, 8_000))
    assert large <= 4.4 * small, (small, large)
    clean(hostile_block(kind, 20_000))  # and it finishes


def test_reading_order_work_is_bounded_on_many_scattered_blocks():
    def scattered(n):
        # Narrow blocks at every x position: hundreds of gutter candidates, no real columns.
        return [
            Block([Line("word" * (i % 7 + 1), (i * 37) % 560, (i * 13) % 700, 0, 0)])
            for i in range(n)
        ]

    def blocks_at(n):
        blocks = scattered(n)
        for block in blocks:
            block.x1 = block.lines[0].x1 = block.x0 + 3
            block.y1 = block.lines[0].y1 = block.y0 + 8
        return blocks

    small = count_lines(reading_order, blocks_at(2_000))
    large = count_lines(reading_order, blocks_at(8_000))
    assert large <= 4.4 * small, (small, large)


def test_lines_with_infinite_or_nan_boxes_keep_their_text():
    """A damaged font can make MuPDF report such boxes; the column search must not fail."""

    class Page:  # what page.get_text("dict") returns, with broken boxes
        def get_text(self, kind, flags):
            def line(text, box):
                return {"bbox": box, "spans": [{"text": text}]}

            column = [line("x" * 40, (50, 100 + i * 12, 290, 110 + i * 12)) for i in range(30)]
            other = [line("y" * 40, (320, 100 + i * 12, 560, 110 + i * 12)) for i in range(30)]
            broken = [
                line("infinite box", (float("-inf"), 0, float("inf"), 10)),
                line("nan box", (float("nan"),) * 4),
            ]
            return {
                "blocks": [
                    {"type": 0, "lines": broken},
                    {"type": 0, "lines": column},
                    {"type": 0, "lines": other},
                    {"type": 1},  # an image block
                ]
            }

    blocks = reading_order(pdftext.page_blocks(Page(), 0))
    text = page_text(blocks).text
    assert "infinite box" in text and "nan box" in text
    assert text.index("x" * 40) < text.index("y" * 40)
