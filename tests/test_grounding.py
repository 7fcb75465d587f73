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
            },
            {
                "start": 6,
                "end": 9,
                "text": "bad",
                "verdict": "contradicted",
                "chunk_ids": [4],
                "score": None,
            },
        ],
        "grounder": "x",
        "warnings": ["w"],
    }


# --- the LLM judge ------------------------------------------------------------------------------


def test_llm_judge_marks_sentences_with_offsets_sources_and_a_character_score():
    llm = ScriptedLLM(
        judge(
            {"sentence": 1, "claim": "14 days", "verdict": "supported", "sources": [1]},
            {"sentence": 2, "claim": "free", "verdict": "contradicted", "sources": [2]},
            {"sentence": 3, "claim": "none", "verdict": "supported", "sources": []},
        )
    )
    grounding = LLMGrounder(llm=llm).ground(ANSWER, CHUNKS, question="Refunds and shipping?")
    assert [(s.verdict, s.chunk_ids) for s in grounding.spans] == [
        ("supported", [11]),
        ("contradicted", [12]),
        ("supported", []),
    ]
    for span in grounding.spans:
        assert ANSWER[span.start : span.end] == span.text
    assert grounding.spans[1].text == "Shipping is always free [2]."
    supported = len("Refunds take 14 days [1].") + len("Thanks for asking!")
    total = supported + len("Shipping is always free [2].")
    assert grounding.score == pytest.approx(supported / total)
    assert grounding.grounder == "LLMGrounder" and grounding.warnings == []
    prompt = llm.calls[0]["prompt"]
    assert '<source id="2">' in prompt and "2. Shipping is always free [2]." in prompt
    assert "Question: Refunds and shipping?" in prompt


def test_llm_judge_parsing_is_tolerant():
    # A fenced bare list, synonyms, string numbers, a worse claim winning over a better one,
    # an unusable item and a skipped sentence.
    reply = (
        "Here you go:\n```json\n"
        + json.dumps(
            [
                {"sentence": "1", "verdict": "Supported", "sources": "[1]"},
                {"sentence": 2, "verdict": "SUPPORT", "sources": ["2"]},
                {"sentence": 2, "verdict": "not supported", "sources": []},
                {"sentence": 9, "verdict": "supported"},
            ]
        )
        + "\n```"
    )
    grounding = LLMGrounder(llm=ScriptedLLM(reply)).ground(ANSWER, CHUNKS)
    assert [s.verdict for s in grounding.spans] == ["supported", "unsupported", "unsupported"]
    assert grounding.spans[0].chunk_ids == [11] and grounding.spans[1].chunk_ids == []
    assert any("sentence 3" in w for w in grounding.warnings)
    assert any("not understood" in w for w in grounding.warnings)
    assert parse_verdict(True) == "supported" and parse_verdict("Refuted.") == "contradicted"
    assert parse_verdict("maybe") is None


def test_a_custom_judge_prompt_is_used():
    seen = []

    def prompt(question, chunks, sentences):
        seen.append(sentences)
        return "MY PROMPT " + grounding_prompt(question, chunks, sentences)

    llm = ScriptedLLM(judge({"sentence": 1, "verdict": "supported", "sources": [1]}))
    grounding = LLMGrounder(llm=llm, prompt=prompt).ground("Refunds take 14 days.", CHUNKS)
    assert seen == [["Refunds take 14 days."]] and llm.calls[0]["prompt"].startswith("MY PROMPT")
    assert grounding.score == 1.0


def test_a_failing_grounder_gives_a_warning_not_an_exception():
    for reply in ("no json at all", RuntimeError("provider down")):
        grounding = ground_text(ANSWER, CHUNKS, LLMGrounder(llm=ScriptedLLM(reply)))
        assert grounding.score == 0.0 and grounding.spans == []
        assert grounding.warnings[0].startswith("grounding failed: LLM")

    def broken(text, chunks):
        return [GroundedSpan(0, 3, text[:3], "maybe", [])]

    grounding = ground_text(ANSWER, CHUNKS, broken)
    assert "verdict 'maybe'" in grounding.warnings[0]


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
        "Refunds take 14 days [1].",
        judge({"sentence": 1, "verdict": "supported", "sources": [1]}),
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


def test_ask_grounding_failure_is_a_warning(corpus):
    llm = ScriptedLLM("Refunds take 14 days [1].", "garbage")
    answer = rag.ask("refunds", llm=llm, collection="policies", limit=1, ground="llm")
    assert answer.text == "Refunds take 14 days [1]."
    assert answer.grounding.score == 0.0 and answer.warnings[0].startswith("ground: grounding")


def test_ask_streamed_answer_is_grounded(corpus):
    llm = ScriptedLLM("Refunds take 14 days [1].", judge({"sentence": 1, "verdict": "unsupported"}))
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
            {"sentence": 1, "verdict": "supported", "sources": [1]},
            {"sentence": 2, "verdict": "contradicted", "sources": [2]},
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
    assert failed.error is None and failed.result.grounding.score == 0.0
    assert any(w.startswith("ground: grounding failed") for w in failed.warnings)


def test_loop_grounds_its_final_answer(corpus):
    llm = ScriptedLLM(
        ("search", {"query": "refund", "limit": 1}),
        ("answer", {"text": "Refunds take 14 days [1]."}),
        judge({"sentence": 1, "verdict": "supported", "sources": [1]}),
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
            {"sentence": 1, "verdict": "supported", "sources": [1]},
            {"sentence": 2, "verdict": "contradicted", "sources": ["2"]},
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
    assert "<answer_sentences>" in sent and REFUNDS in sent


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
    missing = ground_text(DRILL_ANSWER, DRILL, CrossEncoderGrounder(model="/no/such/model"))
    assert missing.spans == [] and missing.warnings[0].startswith("grounding failed")


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
                {"sentence": 1, "verdict": "supported", "sources": [1]},
                {"sentence": 2, "verdict": "contradicted", "sources": [1]},
            ),
        ),
    }
    out = StringIO()
    call_command(
        "rag_ask", "refunds", "--collection", "policies", "--mode", "fulltext", "--limit", "1",
        "--ground", stdout=out,
    )  # fmt: skip
    text = out.getvalue()
    assert "Grounding (LLMGrounder): " in text and "% of the answer supported" in text
    assert "  contradicted: Refunds are instant. (chunks " in text
    assert "Refunds take 14 days [1]." not in text.split("Grounding")[1]


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
            "Check an answer against its sources": judge(
                {"sentence": 1, "verdict": "supported", "sources": [1]},
                {"sentence": 2, "verdict": "contradicted", "sources": [1]},
            ),
        }
    )
    with settings(llm):
        body = post(staff, kind="pipeline", steps=["ground"])
    assert '<mark class="grounded supported"' in body
    assert '<mark class="grounded contradicted"' in body
    assert any("Check an answer against its sources" in c["prompt"] for c in llm.calls)
