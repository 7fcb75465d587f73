"""Model output is hostile input (issue 23, round three): every parser of text we did not
write (LLM replies, tool arguments, judge verdicts, source numbers, free text scrubbed of
secrets, graph extraction) is linear in its input and capped in size and depth before any
regex or recursion runs.

Property-based (hypothesis) over adversarial shapes: long runs of one character or of a short
pattern, deep nesting, huge valid JSON. Each call's CPU time (``time.process_time()``, so a
loaded machine does not fail it) must stay under a generous bound: the linear code takes
milliseconds on these inputs, the code these tests replaced took 10 to 40 s on the largest.
The known cases of the issue come first, as plain regression tests.
"""

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_rag.answers.grounding import LLMGrounder, parse_verdict, split_sentences
from django_rag.answers.grounding.base import claim_text
from django_rag.answers.grounding.llm import _numbers
from django_rag.answers.service import parse_citations
from django_rag.conf import redact, scrub_text
from django_rag.exceptions import LLMResponseError
from django_rag.graph.extractors import CapitalizedEntityExtractor
from django_rag.llm import ToolCall, parse_json
from django_rag.llm.parsing import (
    MAX_JSON_CHARS,
    MAX_JSON_DEPTH,
    json_depth_exceeds,
    value_too_large,
)
from django_rag.llm.prompting import quote
from django_rag.testing import ScriptedLLM

# CPU seconds one call may take on the inputs below (at most a few hundred thousand
# characters; huge JSON about a million): generous, so only super-linear code fails it.
BOUND = 2.0
HUGE_BOUND = 4.0

PROPERTY = settings(
    max_examples=25,
    deadline=None,  # timed here, as CPU time
    database=None,
    derandomize=True,  # the same examples on every run and machine
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


def cpu(function, *args, **kwargs):
    """``function(*args, **kwargs)`` -> (result or the exception raised, CPU seconds)."""
    start = time.process_time()
    try:
        result = function(*args, **kwargs)
    except Exception as exc:  # the callers assert which exceptions are allowed
        result = exc
    return result, time.process_time() - start


# --- strategies ---------------------------------------------------------------------------------

# One character or a short pattern that some parser treats specially, repeated.
PIECES = [
    "{", "[", "}", "]", '"', "\\", ",", ":", ".", "!", "?", "!?", " ", "\n", "\t", "`", "```",
    '{"', '["', "[1,", "{x}", "[1]", " [1]", ". ", "a.", "A ", "Ab. ", "A.", "1", "a", "aB3",
    "True", "None,", "key=", "api_key=", "a=", "-", "1-", "http://", "a://", "?a", "&", "<",
    "< ", "</", "<source", "é", "\u200b", "@", "/", "x/",
]  # fmt: skip


def runs(sizes=(5_000, 40_000, 150_000)):
    """``head + piece * n + tail``: a long run of one character or short pattern (hypothesis
    would otherwise favour short ones; the quadratic cases needed length to show)."""
    return st.builds(
        lambda head, piece, n, tail: head + piece * max(1, n // len(piece)) + tail,
        st.text(max_size=30),
        st.sampled_from(PIECES),
        st.sampled_from(sizes),
        st.text(max_size=30),
    )


def mixed_runs():
    """Several runs one after the other (a run of dots, then spaces, then braces...)."""
    return st.lists(runs((1_000, 10_000, 40_000)), min_size=2, max_size=5).map("".join)


def nesting():
    """Brackets nested deep, balanced or not, around some content."""
    return st.builds(
        lambda opener, depth, inner, closed: (
            opener * depth + inner + {"[": "]", "{": "}"}[opener] * int(depth * closed)
        ),
        st.sampled_from(["[", "{"]),
        st.sampled_from([10, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 1_000, 50_000]),
        st.sampled_from(["", "1", '"a"', '"k": 1', "x", "[1, 2,]"]),
        st.sampled_from([0.0, 0.5, 1.0]),
    )


def hostile_text():
    return st.one_of(runs(), mixed_runs(), nesting())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def huge_json():
    """A valid JSON object of about a million characters: one small value repeated."""

    def build(value):
        one = json.dumps(value)
        copies = max(1, 1_000_000 // (len(one) + 2))
        return {"items": [value] * copies}

    return json_values.map(build)


# --- the known cases ----------------------------------------------------------------------------


def test_known_cases_of_the_issue_are_linear():
    # parse_json on 20k "{" took 19.7 s; a gate reply of 15k "{" 10.8 s; 40k dots 41 s.
    result, seconds = cpu(parse_json, "{" * 20_000)
    assert isinstance(result, LLMResponseError) and seconds < 1.0
    result, seconds = cpu(split_sentences, "a" + "." * 40_000)
    assert result == [(0, 40_001)] and seconds < 1.0
    result, seconds = cpu(split_sentences, "Done" + "!?" * 20_000 + " and more")
    assert len(result) == 1 and seconds < 1.0
    result, seconds = cpu(claim_text, "a" + " " * 40_000 + "b")
    assert result == "a" + " " * 40_000 + "b" and seconds < 1.0
    # Valid JSON of 1.1 MB took 11 s: every comma re-sliced the rest.
    value = {"entities": [{"name": f"E{i}", "description": "x" * 40} for i in range(16_000)]}
    text = json.dumps(value)
    assert len(text) > 1_000_000
    result, seconds = cpu(parse_json, "Here it is:\n" + text + "\nDone.")
    assert result == value and seconds < HUGE_BOUND
    # scrub_text (every error message, log line and telemetry attribute) on one long word.
    result, seconds = cpu(scrub_text, "a" * 100_000)
    assert result == "a" * 100_000 and seconds < 1.0


def test_a_gate_reply_of_braces_falls_back_at_once():
    from django_rag.agent import Context, steps

    ctx = Context("Which plan has phone support?", llm=ScriptedLLM("{" * 15_000))
    ctx, seconds = cpu(steps.gate, ctx)
    assert ctx.skip_retrieval is False and ctx.error is None
    assert ctx.warnings and "gate" in ctx.warnings[0] and seconds < 1.0


def test_json_caps_refuse_before_any_recursion():
    with pytest.raises(LLMResponseError, match="more than"):
        parse_json("x" * (MAX_JSON_CHARS + 1))
    with pytest.raises(LLMResponseError, match="levels deep"):
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), expect=None)
    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json_depth_exceeds(deep) is False and json_depth_exceeds("[" + deep + "]") is True
    assert json_depth_exceeds('["' + "[" * 500 + '"]') is False  # brackets in a string
    nested: list = []
    for _ in range(5_000):
        nested = [nested]
    assert "levels deep" in value_too_large(nested)
    looped: dict = {}
    looped["self"] = looped
    assert value_too_large(looped)  # a value that holds itself is infinitely deep
    assert value_too_large({"a": [1, {"b": 2}]}) is None


def test_tool_arguments_nested_deep_are_refused_not_raised():
    text = '{"query": ' + "[" * 5_000 + "]" * 5_000 + "}"
    call = ToolCall.parse("c1", "search", text)
    assert call.arguments == {} and "levels deep" in call.error
    nested: dict = {"query": "x"}
    for _ in range(5_000):
        nested = {"query": nested}
    call = ToolCall.parse("c2", "search", nested)
    assert call.arguments == {} and "levels deep" in call.error
    assert call.to_dict()["function"]["arguments"] == "{}"
    direct = ToolCall("c3", "search", nested)  # built by a backend, not parsed
    assert direct.arguments == {} and "levels deep" in direct.error
    call = ToolCall.parse("c4", "search", {"query": {1, 2}})  # a set is not JSON
    assert call.arguments == {} and "not JSON" in call.error
    call = ToolCall.parse("c5", "search", '{"q": "' + "x" * (MAX_JSON_CHARS + 1) + '"}')
    assert call.arguments == {} and call.raw_arguments == "" and "characters" in call.error


def test_numbers_and_verdicts_from_a_judge_are_bounded():
    assert _numbers("1" * 5_000) == [] and _numbers("[1][3]") == [1, 3]
    assert _numbers(10**5000) == [] and _numbers(2.0) == [2]
    assert parse_verdict("supported" + " " * 100_000) is None
    assert parse_verdict(" Not-Supported. ") == "unsupported"


# --- properties ---------------------------------------------------------------------------------


@PROPERTY
@given(text=hostile_text(), expect=st.sampled_from([dict, list, None]))
def test_parse_json_is_linear_and_only_raises_its_own_error(text, expect):
    result, seconds = cpu(parse_json, text, expect=expect)
    assert seconds < BOUND, f"{seconds:.2f} s on {text[:80]!r}... ({len(text):,} characters)"
    if isinstance(result, Exception):
        assert isinstance(result, LLMResponseError), repr(result)
    else:
        assert expect is None or isinstance(result, expect)


@settings(PROPERTY, max_examples=8)
@given(value=huge_json(), prose=st.sampled_from(["", "Sure! ", "```json\n"]))
def test_parse_json_reads_huge_valid_json_in_linear_time(value, prose):
    text = prose + json.dumps(value) + ("\n```" if prose.startswith("```") else "")
    result, seconds = cpu(parse_json, text)
    assert seconds < HUGE_BOUND, f"{seconds:.2f} s on {len(text):,} characters"
    assert result == value


@PROPERTY
@given(value=st.dictionaries(st.text(max_size=8), json_values, max_size=5), wrap=st.integers(0, 3))
def test_parse_json_finds_the_value_however_it_is_wrapped(value, wrap):
    text = json.dumps(value)
    text = [
        text,
        f"```json\n{text}\n```",
        f'It is 5" tall, so: {text} (done)',
        f"[1, 2] then {text}",
    ][wrap]
    assert parse_json(text) == value


@PROPERTY
@given(text=hostile_text())
def test_split_sentences_is_linear_and_its_spans_are_sound(text):
    spans, seconds = cpu(split_sentences, text)
    assert seconds < BOUND, f"{seconds:.2f} s on {text[:80]!r}..."
    assert not isinstance(spans, Exception), repr(spans)
    previous = 0
    for start, end in spans:
        assert previous <= start < end <= len(text)
        assert text[start:end] == text[start:end].strip()
        previous = end


@PROPERTY
@given(text=hostile_text())
def test_citation_and_claim_parsing_is_linear(text):
    for function in (claim_text, lambda t: parse_citations(t, []), _numbers, parse_verdict):
        result, seconds = cpu(function, text)
        assert seconds < BOUND, f"{seconds:.2f} s on {text[:80]!r}..."
        assert not isinstance(result, Exception), repr(result)


@PROPERTY
@given(text=hostile_text())
def test_tool_arguments_are_parsed_in_linear_time_and_never_raise(text):
    call, seconds = cpu(ToolCall.parse, "c1", "search", text)
    assert seconds < BOUND, f"{seconds:.2f} s on {text[:80]!r}..."
    assert isinstance(call, ToolCall), repr(call)
    assert isinstance(call.arguments, dict)
    assert call.arguments or call.error or not text.strip()
    message, seconds = cpu(call.to_dict)
    assert isinstance(message, dict) and seconds < BOUND


@PROPERTY
@given(depth=st.integers(1, 20_000), leaf=st.sampled_from([1, "x", None, [], {}]))
def test_tool_arguments_of_any_depth_never_raise(depth, leaf):
    value = leaf
    for index in range(depth):
        value = {"k": value} if index % 2 else [value]
    call, seconds = cpu(ToolCall.parse, "c1", "search", {"query": value})
    assert isinstance(call, ToolCall) and seconds < BOUND, repr(call)
    assert (call.error is None) == (depth + 1 <= MAX_JSON_DEPTH)


@PROPERTY
@given(text=hostile_text())
def test_secret_scrubbing_is_linear(text):
    for function in (scrub_text, redact, lambda t: redact({"url": t, "api_key": t})):
        result, seconds = cpu(function, text)
        assert seconds < BOUND, f"{seconds:.2f} s on {text[:80]!r}..."
        assert not isinstance(result, Exception), repr(result)


@PROPERTY
@given(text=hostile_text())
def test_quoting_and_entity_extraction_are_linear(text):
    extractor = CapitalizedEntityExtractor()
    for function in (quote, extractor.extract):
        result, seconds = cpu(function, text)
        assert seconds < BOUND, f"{seconds:.2f} s on {text[:80]!r}..."
        assert not isinstance(result, Exception), repr(result)


@PROPERTY
@given(answer=hostile_text(), verdict=hostile_text())
def test_the_llm_grounder_on_hostile_answers_and_verdicts(answer, verdict):
    from django_rag.results import SearchResult

    chunk = SearchResult(chunk_id=1, document_id=1, text="Refunds take 14 days.", score=1.0)
    grounder = LLMGrounder(llm=ScriptedLLM(default=verdict))
    result, seconds = cpu(grounder.ground, answer, [chunk])
    # Twice the bound: splitting the answer, then parsing the verdict.
    assert seconds < 2 * BOUND, f"{seconds:.2f} s on {answer[:60]!r} / {verdict[:60]!r}"
    if isinstance(result, Exception):
        assert isinstance(result, LLMResponseError), repr(result)
