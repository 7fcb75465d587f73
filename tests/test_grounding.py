"""Grounding: the LLM judge (scripted, then over HTTP), the local cross-encoder grounder (a tiny
model built here), ask(ground=...), the agent's ground step and Loop(ground=...)."""

import json

import pytest
from django.core import checks

import django_rag as rag
from django_rag.agent import Agent
from django_rag.answers.grounding import (
    CrossEncoderGrounder,
    EmbeddingGrounder,
    Grounder,
    LLMGrounder,
    attribute,
    get_grounder,
    ground_text,
    grounding_prompt,
    parse_verdict,
    split_sentences,
)
from django_rag.exceptions import ConfigurationError
from django_rag.results import GroundedSpan, Grounding, SearchResult
from django_rag.testing import HashingEmbedder, ScriptedLLM
from tests.conftest import stub_llm
from tests.helpers import tiny_bert

REFUNDS = "Refunds are paid within 14 days of the return reaching our warehouse."
SHIPPING = "Shipping is free for orders over 50 euros; other orders pay a flat 4 euro fee."
ANSWER = "Refunds take 14 days [1]. Shipping is always free [2]. Thanks for asking!"


def chunk(chunk_id, text):
    return SearchResult(chunk_id=chunk_id, text=text, score=1.0)


CHUNKS = [chunk(11, REFUNDS), chunk(12, SHIPPING)]


def judge(*claims):
    return json.dumps({"claims": list(claims)})


@pytest.fixture
def corpus(db):
    rag.ingest(REFUNDS, collection="policies", source_id="refunds", title="Refund policy")
    rag.ingest(SHIPPING, collection="policies", source_id="shipping", title="Shipping")


@pytest.fixture
def sources(corpus):
    """The two policies as search results from the database: [refunds, shipping]."""
    return [
        rag.search(word, collection="policies", mode="fulltext", limit=1)[0]
        for word in ("refunds", "shipping")
    ]


# --- sentences and results ----------------------------------------------------------------------


def test_split_sentences_gives_trimmed_offsets_with_citations_kept():
    text = "  Drills use 500 W [1]. Saws cut wood, e.g. pine [2][3]! Is it?\n- one item\n[4]\n"
    pieces = [text[a:b] for a, b in split_sentences(text)]
    assert pieces == [
        "Drills use 500 W [1].",
        "Saws cut wood, e.g. pine [2][3]!",
        "Is it?",
        "- one item",
    ]
    assert split_sentences("") == [] and split_sentences(" [1] ") == []


def test_grounding_to_dict_and_unsupported():
    spans = [
        GroundedSpan(0, 5, "Hello", "supported", [3], 0.9),
        GroundedSpan(6, 9, "bad", "contradicted", [4]),
    ]
    grounding = Grounding(score=0.5, spans=spans, grounder="x", warnings=["w"])
    assert grounding.unsupported == [spans[1]]
    assert grounding.to_dict() == {
        "score": 0.5,
        "spans": [
            {
                "start": 0,
                "end": 5,
                "text": "Hello",
                "verdict": "supported",
                "chunk_ids": [3],
                "score": 0.9,
                "sources": [],
            },
            {
                "start": 6,
                "end": 9,
                "text": "bad",
                "verdict": "contradicted",
                "chunk_ids": [4],
                "score": None,
                "sources": [],
            },
        ],
        "grounder": "x",
        "warnings": ["w"],
    }


# --- the LLM judge ------------------------------------------------------------------------------

JUDGE = "Break the answer into its separate factual claims"  # a phrase of the judge's prompt


def claim(text, verdict, *indices):
    return {"text": text, "verdict": verdict, "chunk_indices": list(indices)}


def test_llm_judge_locates_claims_verbatim_and_scores_supported_claims_over_claims(sources):
    refunds, shipping = sources
    assert (refunds.text, shipping.text) == (REFUNDS, SHIPPING)
    llm = ScriptedLLM(
        judge(
            claim("Refunds take 14 days", "supported", 1),
            claim("Shipping is always free", "contradicted", 2),
            claim("refunds are paid by cheque", "unsupported"),
        )
    )
    grounding = LLMGrounder(llm=llm).ground(ANSWER, sources, question="Refunds and shipping?")
    assert [(s.text, s.verdict, s.chunk_ids) for s in grounding.spans] == [
        ("Refunds take 14 days", "supported", [refunds.chunk_id]),
        ("Shipping is always free", "contradicted", [shipping.chunk_id]),
    ]
    for span in grounding.spans:
        assert ANSWER[span.start : span.end] == span.text
    assert grounding.score == pytest.approx(1 / 3)  # the claim not in the answer still counts
    assert grounding.grounder == "LLMGrounder"
    assert grounding.warnings == ["1 claim(s) were not found in the answer (no span; scored)"]
    prompt = llm.calls[0]["prompt"]
    assert JUDGE in prompt and '<source id="2"' in prompt and SHIPPING in prompt
    assert f"<answer>\n{ANSWER}\n</answer>" in prompt
    assert "Question: Refunds and shipping?" in prompt


def test_claims_are_located_whatever_their_case_and_spacing():
    text = "The  Refund window is\n14 DAYS long. Shipping is free over 50 euros."
    llm = ScriptedLLM(
        judge(
            claim("the refund window is 14 days", "supported", 1),
            claim("shipping is free   over 50 euros", "supported", 2),
        )
    )
    grounding = LLMGrounder(llm=llm).ground(text, CHUNKS)
    assert [s.text for s in grounding.spans] == [
        "The  Refund window is\n14 DAYS",
        "Shipping is free over 50 euros",
    ]
    assert [text[s.start : s.end] for s in grounding.spans] == [s.text for s in grounding.spans]
    assert grounding.score == 1.0 and grounding.warnings == []


def test_a_claim_quoted_twice_is_found_at_each_place():
    text = "It is free. Returns: it is free."
    llm = ScriptedLLM(
        judge(claim("it is free", "supported", 2), claim("it is free", "unsupported"))
    )
    first, second = LLMGrounder(llm=llm).ground(text, CHUNKS).spans
    assert (first.start, second.start) == (0, text.rindex("it is free"))
    assert (first.verdict, second.verdict) == ("supported", "unsupported")


def test_blank_answer_scores_one_without_calling_the_llm(sources):
    llm = ScriptedLLM()
    for blank in ("", "   \n\t "):
        grounding = LLMGrounder(llm=llm).ground(blank, sources)
        assert grounding.score == 1.0 and grounding.spans == []
    assert llm.calls == []


def test_an_answer_without_chunks_scores_zero_without_calling_the_llm():
    llm = ScriptedLLM()
    grounding = LLMGrounder(llm=llm).ground(ANSWER, [])
    assert grounding.score == 0.0 and grounding.spans == []
    assert grounding.warnings == ["no sources to ground the answer in"]
    assert llm.calls == []


def test_an_answer_without_claims_scores_one():
    for reply in (judge(), judge({"text": "   ", "verdict": "supported"}), '{"claims": []}'):
        grounding = LLMGrounder(llm=ScriptedLLM(reply)).ground("Thanks for asking!", CHUNKS)
        assert grounding.score == 1.0 and grounding.spans == []
        assert "the judge found no claim" in grounding.warnings


def test_unknown_verdicts_count_as_unsupported_and_unknown_sources_are_dropped(sources):
    reply = (
        "Here you go:\n```json\n"
        + judge(
            {"claim": "Refunds take 14 days", "verdict": "Supported", "chunk_indices": "[1][7]"},
            {"text": "Shipping is always free", "verdict": "maybe", "chunk_indices": [2, 0, -1]},
            {"text": 42, "verdict": "supported"},
            "a bare string",
        )
        + "\n```"
    )
    grounding = LLMGrounder(llm=ScriptedLLM(reply)).ground(ANSWER, sources)
    assert [(s.verdict, s.chunk_ids) for s in grounding.spans] == [
        ("supported", [sources[0].chunk_id]),
        ("unsupported", [sources[1].chunk_id]),
    ]
    assert grounding.score == 0.5  # the two items with no claim text are not claims
    assert any("2 item(s)" in w for w in grounding.warnings)
    assert any("counted as unsupported" in w for w in grounding.warnings)
    assert parse_verdict(True) == "supported" and parse_verdict("Refuted.") == "contradicted"
    assert parse_verdict("maybe") is None


def test_a_custom_judge_prompt_is_used():
    seen = []

    def prompt(question, chunks, answer):
        seen.append(answer)
        return "MY PROMPT " + grounding_prompt(question, chunks, answer)

    llm = ScriptedLLM(judge(claim("Refunds take 14 days", "supported", 1)))
    grounding = LLMGrounder(llm=llm, prompt=prompt).ground("Refunds take 14 days.", CHUNKS)
    assert seen == ["Refunds take 14 days."] and llm.calls[0]["prompt"].startswith("MY PROMPT")
    assert grounding.score == 1.0


def test_a_failing_grounder_leaves_the_result_unset_and_logs_and_reports_it(caplog, events):
    for reply in ("no json at all", '{"verdicts": []}', RuntimeError("provider down")):
        warnings = []
        with caplog.at_level("WARNING", logger="django_rag.answers.grounding"):
            grounding = ground_text(
                ANSWER, CHUNKS, LLMGrounder(llm=ScriptedLLM(reply)), warnings=warnings
            )
        assert grounding is None
        assert len(warnings) == 1 and warnings[0].startswith("grounding failed: LLM")
        assert warnings[0] in caplog.text
    stops = [m for kind, name, m in events if kind == "stop" and name == "agent.ground"]
    assert len(stops) == 3 and all(m["error"].startswith("LLM") for m in stops)
    assert all("score" not in m for m in stops)

    def broken(text, chunks):
        return [GroundedSpan(0, 3, text[:3], "maybe", [])]

    warnings = []
    assert ground_text(ANSWER, CHUNKS, broken, warnings=warnings) is None
    assert "verdict 'maybe'" in warnings[0]


def test_a_judge_reply_too_long_or_with_too_many_claims_is_bounded():
    from django_rag.answers.grounding.llm import MAX_CLAIMS, MAX_REPLY_CHARS

    long_reply = judge(claim("Refunds take 14 days", "supported", 1)) + " " * MAX_REPLY_CHARS
    warnings = []
    assert (
        ground_text(ANSWER, CHUNKS, LLMGrounder(llm=ScriptedLLM(long_reply)), warnings=warnings)
        is None
    )
    assert "more than" in warnings[0]

    many = judge(*[{"text": "14 days", "verdict": "supported"}] * 3_000)
    grounding = LLMGrounder(llm=ScriptedLLM(many)).ground(ANSWER, CHUNKS)
    assert len(grounding.spans) == MAX_CLAIMS and grounding.score == 1.0
    assert (
        grounding.warnings[0] == f"the judge returned 3000 claims; the first {MAX_CLAIMS} were read"
    )


def test_grounder_specs(settings):
    assert isinstance(get_grounder("llm"), LLMGrounder)
    built = get_grounder({"BACKEND": "nli", "OPTIONS": {"model": "/x", "threshold": 0.7}})
    assert isinstance(built, CrossEncoderGrounder) and built.threshold == 0.7
    assert isinstance(get_grounder("embedding"), EmbeddingGrounder)

    def mine(text, chunks):
        return Grounding(1.0, [], "")

    assert get_grounder(mine).ground("x", []).grounder.endswith("mine")
    with pytest.raises(ConfigurationError, match="GROUNDER"):
        get_grounder({"BACKEND": "nli", "OPTIONS": {"threshold": "high"}})
    with pytest.raises(ConfigurationError, match="ground"):
        get_grounder(42)
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "GROUNDER": None}
    with pytest.raises(ConfigurationError, match="no grounder"):
        get_grounder(True)
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "GROUNDER": "nonsense.module.Thing"}
    errors = [e for e in checks.run_checks() if e.id == "django_rag.E002"]
    assert errors and "GROUNDER" in errors[0].msg


def test_embedding_grounder_uses_cosine_similarity():
    grounder = EmbeddingGrounder(embedder=HashingEmbedder(), threshold=0.99)
    grounding = grounder.ground(f"{REFUNDS} Cats are purple.", CHUNKS)
    assert [s.verdict for s in grounding.spans] == ["supported", "unsupported"]
    assert grounding.spans[0].chunk_ids == [11] and grounding.spans[0].score > 0.99
    assert grounding.grounder.startswith("EmbeddingGrounder(")


# --- wired into ask, the agent and the loop -----------------------------------------------------


def test_ask_ground_true_uses_the_setting_and_the_answer_llm(corpus, settings, events):
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "GROUNDER": "llm"}
    llm = ScriptedLLM(
        "Refunds take 14 days [1].", judge(claim("Refunds take 14 days", "supported", 1))
    )
    answer = rag.ask(
        "How long do refunds take?",
        llm=llm,
        collection="policies",
        limit=1,
        ground=True,
        mode="fulltext",
    )
    assert answer.grounding.score == 1.0
    assert answer.grounding.spans[0].chunk_ids == [answer.chunks[0].chunk_id]
    assert answer.usage.calls == 2 and len(llm.calls) == 2
    assert answer.to_dict()["grounding"]["spans"][0]["verdict"] == "supported"
    assert any(e[1] == "agent.ground" and e[0] == "stop" for e in events)


def test_ask_grounding_failure_leaves_the_grounding_unset_with_a_warning(corpus, events):
    llm = ScriptedLLM("Refunds take 14 days [1].", "garbage")
    answer = rag.ask("refunds", llm=llm, collection="policies", limit=1, ground="llm")
    assert answer.text == "Refunds take 14 days [1]."
    assert answer.grounding is None and answer.warnings[0].startswith("ground: grounding failed")
    assert answer.to_dict()["grounding"] is None
    (ask,) = [m for kind, name, m in events if kind == "stop" and name == "ask"]
    assert "grounding_score" not in ask


def test_ask_streamed_answer_is_grounded(corpus):
    llm = ScriptedLLM(
        "Refunds take 14 days [1].", judge(claim("Refunds take 14 days", "unsupported"))
    )
    stream = rag.ask("refunds", llm=llm, collection="policies", limit=1, stream=True, ground="llm")
    assert "".join(stream) == "Refunds take 14 days [1]."
    assert stream.answer.grounding.spans[0].verdict == "unsupported"


def test_ask_rejects_a_bad_grounder_before_searching(corpus):
    llm = ScriptedLLM()
    with pytest.raises(ConfigurationError):
        rag.ask("refunds", llm=llm, ground="no.such.grounder")
    assert llm.calls == []


def test_agent_ground_step(corpus):
    llm = ScriptedLLM(
        "Refunds take 14 days [1]. Shipping costs 9 euros.",
        judge(
            claim("Refunds take 14 days", "supported", 1),
            claim("Shipping costs 9 euros", "contradicted", 2),
        ),
    )
    agent = Agent("refunds and shipping", llm=llm, mode="fulltext", limit=2)
    agent.search(collection="policies").answer().ground()
    grounding = agent.context.grounding
    assert [s.verdict for s in grounding.spans] == ["supported", "contradicted"]
    used = {c.chunk_id for c in agent.context.context_used}
    assert set(grounding.spans[0].chunk_ids) <= used and grounding.spans[1].chunk_ids
    assert agent.result.grounding is grounding and agent.error is None
    empty = Agent("q", llm=ScriptedLLM()).ground()
    assert empty.error is None and "no answer to ground" in empty.warnings[0]
    failed = Agent("refunds", llm=ScriptedLLM("Text.", RuntimeError("down")), mode="fulltext")
    failed.search(collection="policies").answer().ground()
    assert failed.error is None and failed.result.grounding is None
    assert failed.context.grounding is None
    assert any(w.startswith("ground: grounding failed") for w in failed.warnings)


def test_loop_grounds_its_final_answer(corpus):
    llm = ScriptedLLM(
        ("search", {"query": "refund", "limit": 1}),
        ("answer", {"text": "Refunds take 14 days [1]."}),
        judge(claim("Refunds take 14 days", "supported", 1)),
    )
    result = rag.Loop(
        "refunds?", collection="policies", llm=llm, mode="fulltext", ground="llm"
    ).run()
    assert result.grounding.score == 1.0
    assert result.grounding.spans[0].chunk_ids == [result.chunks[0].chunk_id]
    assert result.to_dict()["grounding"]["score"] == 1.0
    with pytest.raises(ConfigurationError):
        rag.Loop("refunds?", llm=ScriptedLLM(), ground=3.5)


# --- over HTTP ----------------------------------------------------------------------------------


def test_llm_judge_over_http_through_litellm(stub_llm_server):
    stub_llm_server.chat = [
        "```json\n"
        + judge(
            claim("Refunds take 14 days", "supported", 1),
            claim("Shipping is always free", "contradicted", "2"),
        )
        + "\n```"
    ]
    grounder = LLMGrounder(llm=stub_llm(stub_llm_server))
    grounding = ground_text(
        "Refunds take 14 days [1]. Shipping is always free [2].", CHUNKS, grounder
    )
    assert [s.verdict for s in grounding.spans] == ["supported", "contradicted"]
    assert grounding.spans[1].chunk_ids == [12]
    sent = stub_llm_server.chat_requests[-1]["body"]["messages"][-1]["content"]
    assert JUDGE in sent and "<answer>" in sent and REFUNDS in sent


# --- the local cross-encoder grounder -----------------------------------------------------------


@pytest.fixture(scope="module")
def nli_path(tmp_path_factory):
    from transformers import BertForSequenceClassification

    path = tmp_path_factory.mktemp("nli")
    tiny_bert(
        path,
        BertForSequenceClassification,
        num_labels=3,
        id2label={0: "contradiction", 1: "entailment", 2: "neutral"},
        label2id={"contradiction": 0, "entailment": 1, "neutral": 2},
    )
    return str(path)


@pytest.fixture(scope="module")
def relevance_path(tmp_path_factory):
    from transformers import BertForSequenceClassification

    path = tmp_path_factory.mktemp("relevance")
    tiny_bert(path, BertForSequenceClassification, num_labels=1)
    return str(path)


DRILL = [chunk(1, "the drill motor power"), chunk(2, "apple banana fruit")]
DRILL_ANSWER = "The drill has power [1]. Fruit is a banana [2]."


def _probabilities(path, pairs):
    import torch
    from sentence_transformers import CrossEncoder

    logits = torch.tensor(CrossEncoder(path).predict(pairs))
    return torch.softmax(logits, dim=-1).tolist()


def test_nli_grounder_reads_entailment_and_contradiction_from_the_labels(nli_path):
    sentences = ["The drill has power", "Fruit is a banana"]
    pairs = [(c.text, s) for s in sentences for c in DRILL]
    probabilities = _probabilities(nli_path, pairs)
    entail = [p[1] for p in probabilities]
    contra = [p[0] for p in probabilities]
    # Thresholds placed between the model's own probabilities decide each verdict.
    low = min(entail[0], entail[1]) - 1e-6
    grounder = CrossEncoderGrounder(model=nli_path, threshold=low)
    grounding = grounder.ground(DRILL_ANSWER, DRILL)
    first = grounding.spans[0]
    assert first.verdict == "supported" and first.text == "The drill has power [1]."
    assert set(first.chunk_ids) == {1, 2}
    assert first.chunk_ids[0] == (1 if entail[0] >= entail[1] else 2)
    assert first.score == pytest.approx(max(entail[0], entail[1]), abs=1e-5)

    contradicted = CrossEncoderGrounder(
        model=nli_path, threshold=1.01, contradiction_threshold=min(contra) - 1e-6
    ).ground(DRILL_ANSWER, DRILL)
    assert [s.verdict for s in contradicted.spans] == ["contradicted", "contradicted"]
    assert contradicted.spans[1].score == pytest.approx(max(contra[2:]), abs=1e-5)
    assert contradicted.score == 0.0

    nothing = CrossEncoderGrounder(
        model=nli_path, threshold=1.01, contradiction_threshold=1.01
    ).ground(DRILL_ANSWER, DRILL)
    assert [s.verdict for s in nothing.spans] == ["unsupported", "unsupported"]
    # labels= overrides the model's names: treat "neutral" as entailment.
    swapped = CrossEncoderGrounder(
        model=nli_path, labels={"entailment": 2}, threshold=min(p[2] for p in probabilities)
    ).ground(DRILL_ANSWER, DRILL)
    assert swapped.score == 1.0
    assert swapped.grounder == f"CrossEncoderGrounder({nli_path})"


def test_relevance_cross_encoder_grounder_uses_a_threshold(relevance_path):
    from sentence_transformers import CrossEncoder

    scores = CrossEncoder(relevance_path).predict(
        [(c.text, s) for s in ["The drill has power", "Fruit is a banana"] for c in DRILL]
    )
    middle = sorted(float(v) for v in scores)
    cut = (max(scores[0], scores[1]) + max(scores[2], scores[3])) / 2
    grounding = CrossEncoderGrounder(model=relevance_path, threshold=float(cut)).ground(
        DRILL_ANSWER, DRILL
    )
    verdicts = [s.verdict for s in grounding.spans]
    assert sorted(verdicts) == ["supported", "unsupported"] or middle[0] == middle[-1]
    assert "contradicted" not in verdicts
    for span in grounding.spans:
        assert span.verdict == ("supported" if span.score >= cut else "unsupported")
    assert (
        CrossEncoderGrounder(model=relevance_path, threshold=-1e9).ground(DRILL_ANSWER, DRILL).score
        == 1.0
    )


def test_cross_encoder_grounder_without_sources_or_with_a_missing_model(nli_path):
    grounding = CrossEncoderGrounder(model=nli_path).ground(DRILL_ANSWER, [])
    assert [s.verdict for s in grounding.spans] == ["unsupported", "unsupported"]
    assert grounding.warnings == ["no sources to ground the answer in"]
    warnings = []
    missing = ground_text(
        DRILL_ANSWER, DRILL, CrossEncoderGrounder(model="/no/such/model"), warnings=warnings
    )
    assert missing is None and warnings[0].startswith("grounding failed")


def test_a_grounder_subclass_is_a_grounder():
    class Everything(Grounder):
        def ground(self, text, chunks, *, question=""):
            return Grounding(1.0, [GroundedSpan(0, len(text), text, "supported", [])], "all")

    assert get_grounder(Everything).ground("x", []).score == 1.0


def test_rag_ask_ground_prints_the_unsupported_sentences(corpus, settings):
    from io import StringIO

    from django.core.management import call_command

    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "LLM": ScriptedLLM(
            "Refunds take 14 days [1]. Refunds are instant.",
            judge(
                claim("Refunds take 14 days", "supported", 1),
                claim("Refunds are instant", "contradicted", 1),
            ),
        ),
    }
    out = StringIO()
    call_command(
        "rag_ask", "refunds", "--collection", "policies", "--mode", "fulltext", "--limit", "1",
        "--ground", stdout=out,
    )  # fmt: skip
    text = out.getvalue()
    assert "Grounding (LLMGrounder): score 0.50, 1 of 2 spans supported" in text
    assert "  contradicted: Refunds are instant (chunks " in text
    assert "Refunds take 14 days" not in text.split("Grounding")[1]


def test_rag_ask_ground_says_why_grounding_failed(corpus, settings):
    from io import StringIO

    from django.core.management import call_command

    llm = ScriptedLLM("Refunds take 14 days [1].", RuntimeError("judge down"))
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "LLM": llm}
    out = StringIO()
    call_command(
        "rag_ask", "refunds", "--collection", "policies", "--mode", "fulltext", "--limit", "1",
        "--ground", stdout=out,
    )  # fmt: skip
    text = out.getvalue()
    assert "Grounding: ground: grounding failed: LLM" in text and "judge down" in text
    assert "score" not in text


def test_embedding_grounder_with_the_real_minilm(minilm):
    grounder = EmbeddingGrounder(embedder=minilm, threshold=0.7)
    grounding = grounder.ground(
        "Refunds are paid within 14 days of the return. Penguins live in Antarctica.", CHUNKS
    )
    close, far = grounding.spans
    assert close.verdict == "supported" and close.chunk_ids == [11] and close.score > 0.7
    assert far.verdict == "unsupported" and far.score < 0.3
    assert grounding.grounder == "EmbeddingGrounder(all-MiniLM-L6-v2)"


@pytest.mark.django_db
def test_evaluation_scores_faithfulness_with_the_local_grounder(corpus, nli_path):
    from django_rag.evaluation import create_test_case, run_evaluation
    from django_rag.models import Chunk

    chunk_ = Chunk.objects.get(document__source_id="refunds")
    create_test_case("refunds", chunks=[chunk_], collection="policies")

    def retriever(question, *, collection, limit):
        hit = SearchResult(chunk_id=chunk_.pk, text=chunk_.text, score=1.0)
        return [hit], "The drill has power [1]. Fruit is a banana."

    everything = CrossEncoderGrounder(model=nli_path, threshold=-1.0)
    run = run_evaluation(
        retriever=retriever, evaluate_answers=True, grounder=everything, llm=ScriptedLLM()
    )
    record = run.results[0]
    assert record["faithfulness"] == 10.0 and record["answer_source"] == "retriever"
    assert [s["verdict"] for s in record["grounding"]["spans"]] == ["supported", "supported"]
    assert record["grounding"]["spans"][0]["chunk_ids"] == [chunk_.pk]
    nothing = CrossEncoderGrounder(model=nli_path, threshold=1.01, contradiction_threshold=1.01)
    run = run_evaluation(
        retriever=retriever, evaluate_answers=True, grounder=nothing, llm=ScriptedLLM()
    )
    assert run.results[0]["faithfulness"] == 0.0 and run.metrics["faithfulness"] == 0.0
    assert run.config["grounder"] == "CrossEncoderGrounder"


@pytest.mark.django_db
def test_the_ask_page_runs_the_real_ground_step(staff):
    """The dashboard's pipeline mode with the ground step: this module's grounder, no stand-in."""
    from tests.helpers import ANSWER
    from tests.test_dashboard_ask import post, settings

    rag.ingest("The X200 drill has a two year warranty.", collection="products", source_id="x200")
    llm = ScriptedLLM(
        rules={
            ANSWER: "Two years [1]. It also flies.",
            JUDGE: judge(
                claim("Two years", "supported", 1), claim("It also flies", "contradicted", 1)
            ),
        }
    )
    with settings(llm):
        body = post(staff, kind="pipeline", steps=["ground"])
    assert '<mark class="grounded supported"' in body
    assert '<mark class="grounded contradicted"' in body
    assert any(JUDGE in c["prompt"] for c in llm.calls)


# --- attribution, the question, telemetry, no LLM -----------------------------------------------


def test_attribute_links_each_span_to_the_chunks_it_overlaps_best():
    spans = [
        GroundedSpan(0, 30, "Refunds are paid within 14 days for orders", "supported"),
        GroundedSpan(31, 60, "shipping for orders over 50 EUROS", "unsupported"),
        GroundedSpan(61, 64, "...", "unsupported"),
    ]
    first, second, wordless = attribute(spans, CHUNKS)
    assert [s["chunk_id"] for s in first.sources] == [11, 12]  # best first
    assert first.sources[0]["score"] == 0.75  # 6 of its 8 words
    assert first.sources[1]["score"] == 0.25  # "for orders"
    assert [s["chunk_id"] for s in second.sources] == [12]  # case does not matter
    assert second.sources[0]["score"] == 1.0
    assert wordless.sources == [] and spans[0].sources == []  # the originals are unchanged
    strict = attribute(spans, CHUNKS, min_score=0.5)
    assert [s["chunk_id"] for s in strict[0].sources] == [11]
    assert [s.sources for s in attribute(spans, [])] == [[], [], []]
    assert attribute([], CHUNKS) == []


def test_every_grounders_spans_are_attributed_to_real_chunks(corpus):
    hits = rag.search("refunds shipping", collection="policies", mode="fulltext", limit=5)
    by_text = {hit.text: hit.chunk_id for hit in hits}
    grounding = ground_text(
        f"{REFUNDS} Cats purr loudly.",
        hits,
        EmbeddingGrounder(embedder=HashingEmbedder(), threshold=0.99),
    )
    refunds, cats = grounding.spans
    assert refunds.sources[0] == {"chunk_id": by_text[REFUNDS], "score": 1.0}
    assert cats.sources == []  # no word shared with a chunk
    assert grounding.to_dict()["spans"][0]["sources"][0]["chunk_id"] == by_text[REFUNDS]

    def mine(text, chunks):
        given = [{"chunk_id": "mine", "score": 0.5}]
        return [GroundedSpan(0, len(text), text, "supported", [], None, given)]

    kept = ground_text("Refunds take 14 days.", hits, mine)
    assert kept.spans[0].sources == [{"chunk_id": "mine", "score": 0.5}]  # a grounder's own


def test_function_grounders_get_the_question_when_their_signature_takes_it():
    seen = []

    def old(text, chunks):
        seen.append(("old", None))
        return []

    def positional(text, chunks, question):
        seen.append(("positional", question))
        return []

    def keyword(text, chunks, *, question=""):
        seen.append(("keyword", question))
        return []

    def catch_all(*args, **kwargs):
        seen.append(("catch_all", kwargs.get("question")))
        return []

    def own_default(text, chunks, threshold=0.5):
        seen.append(("own_default", threshold))
        return []

    for func in (old, positional, keyword, catch_all, own_default):
        grounding = ground_text("Refunds take 14 days.", CHUNKS, func, question="Refunds?")
        assert grounding.score == 1.0 and grounding.spans == []  # no spans: nothing unsupported
    assert seen == [
        ("old", None),
        ("positional", "Refunds?"),
        ("keyword", "Refunds?"),
        ("catch_all", "Refunds?"),
        ("own_default", 0.5),  # a third parameter with a default of its own is left alone
    ]
    assert get_grounder(len).question_style == ""  # a builtin: the two-argument call


def test_grounding_telemetry_counts_faithful_and_hallucinated_spans(events, settings):
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "TELEMETRY": {"INCLUDE_TEXT": True}}
    llm = ScriptedLLM(
        judge(
            claim("Refunds take 14 days", "supported", 1),
            claim("Shipping is always free", "contradicted", 2),
            claim("Thanks for asking", "unsupported"),
        )
    )
    ground_text(ANSWER, CHUNKS, LLMGrounder(llm=llm), question="Refunds?")
    (start,) = [m for kind, name, m in events if kind == "start" and name == "agent.ground"]
    (stop,) = [m for kind, name, m in events if kind == "stop" and name == "agent.ground"]
    assert start["question"] == "Refunds?" and start["grounder"] == "LLMGrounder"
    assert stop["faithful_span_count"] == 1 and stop["hallucinated_span_count"] == 2
    assert stop["score"] == pytest.approx(1 / 3) and stop["spans"] == 3


def test_the_embedding_grounder_works_with_no_llm_configured(corpus, settings):
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "LLM": None, "GROUNDER": "embedding"}
    hits = rag.search("refunds", collection="policies", mode="fulltext", limit=1)
    grounding = ground_text(REFUNDS, hits, True)
    assert grounding is not None and grounding.grounder.startswith("EmbeddingGrounder(")
    assert [s.verdict for s in grounding.spans] == ["supported"] and grounding.score == 1.0
    agent = Agent("refunds", llm=ScriptedLLM("Refunds are paid within 14 days."), mode="fulltext")
    agent.search(collection="policies").answer().ground(grounder="embedding")
    assert agent.context.grounding is not None and agent.error is None
