import re

import pytest

from django_rag.exceptions import InvalidOption
from django_rag.ingestion.chunkers import CallableChunker, TokenChunker, get_chunker

LOREM = (
    "Retrieval systems split documents into chunks. Each chunk is embedded separately.\n\n"
    "A good splitter keeps sentences whole. It also respects paragraphs and headings.\n"
    "Overlap between chunks keeps context that would otherwise be cut in half.\n\n"
)


def assert_covers(text, chunks):
    """Every non-whitespace character of text lies inside some chunk."""
    covered = bytearray(len(text))
    for chunk in chunks:
        covered[chunk.start : chunk.end] = b"\x01" * (chunk.end - chunk.start)
    missing = [i for i, ch in enumerate(text) if not covered[i] and not ch.isspace()]
    assert missing == [], f"uncovered characters at {missing[:10]}"


def assert_offsets(text, chunks):
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
        assert chunk.text == chunk.text.strip()
        assert chunk.text


@pytest.mark.parametrize("size,overlap", [(20, 0), (20, 5), (50, 10), (7, 6)])
def test_fallback_tokens_cover_text_with_exact_offsets(size, overlap):
    text = LOREM * 12
    chunks = TokenChunker(chunk_size=size, chunk_overlap=overlap).chunk(text)
    assert len(chunks) > 3
    assert_offsets(text, chunks)
    assert_covers(text, chunks)
    assert all(c.token_count <= size for c in chunks)
    starts = [c.start for c in chunks]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)


def test_overlap_holds_between_neighbours():
    text = LOREM * 10
    chunks = TokenChunker(chunk_size=30, chunk_overlap=8).chunk(text)
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after.start < before.end, "neighbours must overlap"
        shared = text[after.start : before.end]
        assert len(re.findall(r"\w+", shared)) >= 3


def test_no_overlap_means_disjoint_chunks():
    text = LOREM * 10
    chunks = TokenChunker(chunk_size=30, chunk_overlap=0).chunk(text)
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after.start >= before.end


def test_prefers_paragraph_and_sentence_boundaries():
    text = LOREM * 6
    chunks = TokenChunker(chunk_size=40, chunk_overlap=0).chunk(text)
    for chunk in chunks[:-1]:
        assert chunk.text[-1] in ".!?", f"chunk ends mid-sentence: {chunk.text[-30:]!r}"


def test_markdown_headings_start_chunks():
    sections = [f"# Section {i}\n\n" + "Some words about this topic here. " * 12 for i in range(5)]
    text = "\n\n".join(sections)
    chunks = TokenChunker(chunk_size=120, chunk_overlap=0).chunk(text, format="markdown")
    heading_starts = [c for c in chunks if c.text.startswith("# Section")]
    assert len(heading_starts) == 5


def test_very_long_word_is_split_and_covered():
    text = "start " + "x" * 5000 + " end"
    chunks = TokenChunker(chunk_size=50, chunk_overlap=5).chunk(text)
    assert_offsets(text, chunks)
    assert_covers(text, chunks)
    assert all(c.token_count <= 50 for c in chunks)


def test_unicode_offsets_are_exact():
    text = (
        "Ünïcödé façade — naïve café. 東京は日本の首都です。 Emoji 🎉🚀 mixed in; "
        "Ελληνικά και العربية أيضا.\n\n"
    ) * 20
    chunks = TokenChunker(chunk_size=25, chunk_overlap=5).chunk(text)
    assert_offsets(text, chunks)
    assert_covers(text, chunks)


def test_empty_and_whitespace_text_gives_no_chunks():
    chunker = TokenChunker()
    assert chunker.chunk("") == []
    assert chunker.chunk(" \n\t ") == []


@pytest.mark.parametrize(
    "options",
    [
        {"chunk_size": 10, "chunk_overlap": 10},
        {"chunk_size": 10, "chunk_overlap": 20},
        {"chunk_size": 0},
        {"chunk_overlap": -1},
        {"chunk_size": "100"},
    ],
)
def test_bad_options_raise(options):
    with pytest.raises(InvalidOption):
        TokenChunker(**options)


def test_bad_format_raises():
    with pytest.raises(InvalidOption, match="format"):
        TokenChunker().chunk("text", format="html")


def test_callable_chunker_gets_offsets_for_verbatim_pieces():
    text = "alpha beta. gamma delta. alpha beta."
    chunker = get_chunker(lambda t, format: [s.strip() + "." for s in t.split(".") if s.strip()])
    assert isinstance(chunker, CallableChunker)
    chunks = chunker.chunk(text)
    assert [c.text for c in chunks] == ["alpha beta.", "gamma delta.", "alpha beta."]
    assert [c.start for c in chunks] == [0, 12, 25]
    assert_offsets(text, chunks)


def test_callable_chunker_rejects_bad_items():
    with pytest.raises(InvalidOption):
        CallableChunker(lambda t, format: [42]).chunk("text")


def test_get_chunker_merges_per_call_options(settings):
    settings.DJANGO_RAG = {"CHUNKER": {"BACKEND": "token", "OPTIONS": {"chunk_size": 99}}}
    chunker = get_chunker(chunk_overlap=3)
    assert (chunker.chunk_size, chunker.chunk_overlap) == (99, 3)
    instance = TokenChunker(chunk_size=5, chunk_overlap=1)
    assert get_chunker(instance) is instance


@pytest.mark.slow
def test_real_tokenizer_keeps_every_chunk_inside_the_model_window(minilm):
    text = (
        LOREM
        + "Numbers 3.14159, 2.71828 and 1234567890 tokenise densely: "
        + "0x1F 0x2E 0x3D " * 30
        + "\n\n"
    ) * 30
    chunker = TokenChunker(chunk_size=1000, chunk_overlap=40)  # larger than the window
    chunks = chunker.chunk(text, embedder=minilm)
    tokenizer = minilm.model.tokenizer
    assert len(chunks) > 5
    for chunk in chunks:
        ids = tokenizer(chunk.text, add_special_tokens=True, truncation=False)["input_ids"]
        assert len(ids) <= 256, len(ids)
    assert minilm.max_tokens == 254
    assert 200 < max(c.token_count for c in chunks) <= 254
    assert_offsets(text, chunks)
    assert_covers(text, chunks)
