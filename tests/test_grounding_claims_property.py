"""The LLM grounding judge's reply is hostile input: property-based (hypothesis) tests of the
parser of its claims, the location of claims in the answer and the whole grounder, on any
JSON the judge could send (wrong types, malformed items, thousands of claims, any text)."""

import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_rag.answers.grounding.llm import (
    MAX_CLAIM_CHARS,
    MAX_CLAIMS,
    LLMGrounder,
    _fold,
    _Locator,
    parse_claims,
)
from django_rag.exceptions import LLMResponseError
from django_rag.results import VERDICTS, Grounding, SearchResult
from django_rag.testing import ScriptedLLM

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every run and machine
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CHUNKS = [
    SearchResult(chunk_id=11, text="Refunds are paid within 14 days.", score=1.0),
    SearchResult(chunk_id=12, text="Shipping is free over 50 euros.", score=1.0),
]
ANSWER = "Refunds take 14 days [1]. Shipping is always free [2]. Thanks!"

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=60)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=30,
)
verdicts = (
    st.sampled_from(
        ["supported", "Unsupported", "CONTRADICTED", "refuted", "not supported", "maybe", ""]
    )
    | json_values
)
indices = (
    st.lists(st.integers(min_value=-5, max_value=10) | st.text(max_size=8), max_size=8)
    | json_values
)
# Items shaped like claims (text quoted from the answer, or anything) mixed with junk.
claim_items = (
    st.fixed_dictionaries(
        {
            "text": st.sampled_from(
                ["Refunds take 14 days", "shipping IS always  free", "Thanks!", "not there"]
            )
            | json_values,
            "verdict": verdicts,
            "chunk_indices": indices,
        }
    )
    | json_values
)
replies = (
    st.fixed_dictionaries({"claims": st.lists(claim_items, max_size=40)})
    | st.lists(claim_items, max_size=40)
    | json_values
)


def check_claims(claims, warnings, chunk_count):
    assert len(claims) <= MAX_CLAIMS and len(warnings) <= 3
    for claim in claims:
        assert isinstance(claim.text, str) and claim.text.strip()
        assert len(claim.text) <= MAX_CLAIM_CHARS
        assert claim.verdict in VERDICTS
        assert len(set(claim.chunks)) == len(claim.chunks)
        assert all(0 <= position < chunk_count for position in claim.chunks)


@PROPERTY
@given(data=replies, chunk_count=st.integers(min_value=0, max_value=5))
def test_parsed_claims_are_bounded_and_well_typed_whatever_the_judge_sends(data, chunk_count):
    try:
        claims, warnings = parse_claims(data, chunk_count)
    except LLMResponseError:
        assert not isinstance(data, list) and not (
            isinstance(data, dict) and isinstance(data.get("claims"), list)
        )
        return
    check_claims(claims, warnings, chunk_count)


@PROPERTY
@given(
    item=claim_items,
    count=st.integers(min_value=MAX_CLAIMS, max_value=20_000),
    chunk_count=st.integers(min_value=0, max_value=5),
)
def test_thousands_of_claims_are_cut_to_the_cap_quickly(item, count, chunk_count):
    start = time.process_time()
    claims, warnings = parse_claims({"claims": [item] * count}, chunk_count)
    assert time.process_time() - start < 2.0
    check_claims(claims, warnings, chunk_count)
    assert (count > MAX_CLAIMS) == any(f"{count} claims" in w for w in warnings)


@PROPERTY
@given(
    text=st.text(min_size=1, max_size=200), cut=st.tuples(st.integers(0, 200), st.integers(0, 200))
)
def test_any_stretch_of_the_answer_is_located_as_itself(text, cut):
    start, end = sorted(min(c, len(text)) for c in cut)
    needle = _fold(text[start:end])[0].strip()
    where = _Locator(text).find(text[start:end])
    if not needle:
        assert where is None
        return
    assert where is not None
    found = _fold(text[where[0] : where[1]])[0].strip()
    # Equal, except where a character that lowercases to two (İ) is half matched: then the
    # span covers the whole character.
    assert needle in found and len(found) <= len(needle) + 2


@PROPERTY
@given(answer=st.text(max_size=300), reply=replies)
def test_the_judge_gives_a_valid_grounding_or_a_typed_error_on_any_reply(answer, reply):
    grounder = LLMGrounder(llm=ScriptedLLM(default=json.dumps(reply)))
    try:
        grounding = grounder.ground(answer, CHUNKS, question="q")
    except LLMResponseError:
        return
    assert isinstance(grounding, Grounding) and 0.0 <= grounding.score <= 1.0
    for span in grounding.spans:
        assert answer[span.start : span.end] == span.text and span.text.strip()
        assert span.verdict in VERDICTS and set(span.chunk_ids) <= {11, 12}


@PROPERTY
@given(reply=st.text(max_size=400))
def test_malformed_replies_raise_a_typed_error_or_parse(reply):
    grounder = LLMGrounder(llm=ScriptedLLM(default=reply))
    try:
        grounding = grounder.ground(ANSWER, CHUNKS)
    except LLMResponseError:
        return
    assert 0.0 <= grounding.score <= 1.0
