"""context_window: each hit with its neighbouring chunks, overlapping windows merged, one query."""

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_rag as rag
from django_rag.exceptions import InvalidOption
from django_rag.models import Chunk
from django_rag.testing import ScriptedLLM

pytestmark = pytest.mark.django_db

# Ten paragraphs, each with a word found nowhere else ("alphaword0"...), cut one per chunk.
WORDS = [f"zq{n}marker" for n in range(10)]


def paragraphs(prefix: str) -> str:
    return "\n\n".join(
        f"{prefix} paragraph {n} talks about {WORDS[n]} and nothing else of note here."
        for n in range(10)
    )


def chunks_of(document) -> list[Chunk]:
    return list(Chunk.objects.filter(document=document).order_by("chunk_index"))


def window_text(document, first: int, last: int) -> str:
    rows = chunks_of(document)
    return document.content[rows[first].start_char : rows[last].end_char]


@pytest.fixture
def book():
    document = rag.ingest(
        paragraphs("Book"), collection="books", source_id="book", chunk_size=16, chunk_overlap=0
    )
    other = rag.ingest(
        paragraphs("Other"), collection="others", source_id="other", chunk_size=16, chunk_overlap=0
    )
    assert len(chunks_of(document)) == 10, [c.text for c in chunks_of(document)]
    return document, other


def fulltext(query, **options):
    return rag.search(query, mode="fulltext", **options)


def test_a_hit_comes_back_with_its_neighbours_and_its_own_text_unchanged(book):
    document, _ = book
    rows = chunks_of(document)
    [hit] = fulltext(WORDS[4], collection="books", context_window=1)
    assert hit.chunk_index == 4
    assert hit.text == rows[4].text
    assert (hit.context_first, hit.context_last) == (3, 5)
    assert hit.context == window_text(document, 3, 5)
    assert WORDS[3] in hit.context and WORDS[5] in hit.context
    assert WORDS[2] not in hit.context and WORDS[6] not in hit.context
    assert hit.passage == hit.context
    assert hit.merged_chunk_ids == []

    [wide] = fulltext(WORDS[4], collection="books", context_window=2)
    assert (wide.context_first, wide.context_last) == (2, 6)

    [plain] = fulltext(WORDS[4], collection="books")
    assert plain.context is None and plain.passage == plain.text


def test_windows_stop_at_the_document_boundaries(book):
    document, _ = book
    [first] = fulltext(WORDS[0], collection="books", context_window=2)
    assert (first.context_first, first.context_last) == (0, 2)
    assert first.context == window_text(document, 0, 2)
    [last] = fulltext(WORDS[9], collection="books", context_window=2)
    assert (last.context_first, last.context_last) == (7, 9)
    # The other document holds the same words: its text never enters this window.
    assert "Other" not in first.context and "Other" not in last.context


def test_overlapping_windows_merge_into_the_best_ranked_hit(book):
    document, _ = book
    # Chunks 4 and 5 both match; 5 matches twice as often, so it ranks first.
    query = f"{WORDS[5]} {WORDS[5]} {WORDS[4]}"
    plain = fulltext(query, collection="books", syntax="websearch")
    assert [r.chunk_index for r in plain] == [5, 4] or [r.chunk_index for r in plain] == [4, 5]
    leader_index = plain[0].chunk_index
    results = fulltext(query, collection="books", syntax="websearch", context_window=1)
    assert len(results) == 1
    [merged] = results
    assert merged.chunk_index == leader_index
    assert (merged.context_first, merged.context_last) == (3, 6)
    assert merged.context == window_text(document, 3, 6)
    assert merged.merged_chunk_ids == [plain[1].chunk_id]
    # No paragraph twice.
    for word in WORDS[3:7]:
        assert merged.context.count(word) == 1


def test_touching_windows_stay_apart_and_order_is_kept(book):
    # Chunks 1 and 4 with window 1: 0-2 and 3-5 touch without overlapping.
    results = fulltext(f"{WORDS[1]} {WORDS[4]}", collection="books", context_window=1)
    assert sorted(r.chunk_index for r in results) == [1, 4]
    spans = {r.chunk_index: (r.context_first, r.context_last) for r in results}
    assert spans == {1: (0, 2), 4: (3, 5)}
    assert all(r.merged_chunk_ids == [] for r in results)
    plain = fulltext(f"{WORDS[1]} {WORDS[4]}", collection="books")
    assert [r.chunk_id for r in results] == [r.chunk_id for r in plain]


def test_hits_in_different_documents_never_merge(book):
    results = fulltext(WORDS[4], context_window=1)  # both collections
    assert len(results) == 2
    assert {r.source_id for r in results} == {"book", "other"}
    for result in results:
        prefix = "Book" if result.source_id == "book" else "Other"
        assert result.context.count(prefix) == 3


def test_scoped_search_windows_stay_in_scope(book):
    [hit] = fulltext(WORDS[4], collection="others", context_window=1)
    assert hit.source_id == "other" and "Book" not in hit.context
    [hit] = fulltext(WORDS[4], source_id="book", context_window=1)
    assert hit.source_id == "book" and "Other" not in hit.context


def test_all_neighbours_are_read_in_one_query(book):
    query = f"{WORDS[1]} {WORDS[4]} {WORDS[8]}"
    with CaptureQueriesContext(connection) as plain:
        fulltext(query, context_window=0)
    with CaptureQueriesContext(connection) as windowed:
        results = fulltext(query, context_window=1)
    assert len(results) == 6  # three hits in each of the two documents
    assert len(windowed.captured_queries) == len(plain.captured_queries) + 1


def test_overlapping_chunks_are_not_repeated_in_the_window():
    text = " ".join(f"w{n}" for n in range(400))
    document = rag.ingest(text, collection="flat", chunk_size=40, chunk_overlap=10)
    rows = chunks_of(document)
    assert len(rows) >= 5 and rows[1].start_char < rows[0].end_char  # the chunks overlap
    [hit] = fulltext(rows[2].text.split()[-1], collection="flat", limit=1, context_window=1)
    index = hit.chunk_index
    first, last = max(0, index - 1), min(len(rows) - 1, index + 1)
    assert hit.context == text[rows[first].start_char : rows[last].end_char]
    assert hit.context.count(" w150 ") <= 1 and hit.context.split() == sorted(
        set(hit.context.split()), key=hit.context.split().index
    )


def test_the_setting_turns_it_on_and_the_option_turns_it_off(book):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "SEARCH": {"CONTEXT_WINDOW": 1}}):
        [hit] = fulltext(WORDS[4], collection="books")
        assert (hit.context_first, hit.context_last) == (3, 5)
        [hit] = fulltext(WORDS[4], collection="books", context_window=0)
        assert hit.context is None


@pytest.mark.parametrize("value", [-1, 11, 1.5, True, "2"])
def test_bad_windows_are_refused(value):
    with pytest.raises(InvalidOption, match="context_window"):
        rag.search("anything", context_window=value)


def test_another_store_refuses_the_window(book):
    from django_rag.retrieval import MemoryVectorStore

    store = MemoryVectorStore()
    with pytest.raises(InvalidOption, match="pgvector"):
        rag.search("zq4marker", vector_store=store, context_window=1)


def test_ask_gives_the_llm_the_window(book):
    llm = ScriptedLLM("It talks about it [1].")
    answer = rag.ask(
        WORDS[4], llm=llm, collection="books", mode="fulltext", limit=1, context_window=1
    )
    prompt = llm.calls[0]["prompt"]
    assert WORDS[3] in prompt and WORDS[4] in prompt and WORDS[5] in prompt
    assert answer.chunks[0].context_first == 3
    without = ScriptedLLM("It talks about it [1].")
    rag.ask(WORDS[4], llm=without, collection="books", mode="fulltext", limit=1)
    assert WORDS[3] not in without.calls[0]["prompt"]


def test_loop_and_agent_take_the_option(book):
    from django_rag.agent.loop import Loop

    loop = Loop("what about it?", llm=ScriptedLLM("x"), collection="books", context_window=2)
    assert loop.request.context_window == 2
    ctx = rag.Agent(WORDS[4], llm=ScriptedLLM(default="x")).search(
        collection="books", mode="fulltext", context_window=1
    )
    assert ctx.results[0].chunks[0].context_first == 3
