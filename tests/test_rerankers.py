"""Rerankers: the LLM scorer, functions, search(reranker=, rewriter=), and local models
(a cross-encoder and a ColBERT checkpoint built and saved by the tests: nothing is downloaded)."""

import re

import pytest

import django_rag as rag
from django_rag.exceptions import ConfigurationError
from django_rag.rerankers import (
    ColBERTReranker,
    CrossEncoderReranker,
    LLMReranker,
    get_reranker,
)
from django_rag.retrieval.results import SearchResult
from django_rag.testing import ScriptedLLM
from tests.helpers import tiny_bert


def results(*texts):
    return [SearchResult(chunk_id=i, text=t, score=1.0 - i / 10) for i, t in enumerate(texts)]


def score_by_keyword(keyword, high=9, low=1):
    def respond(prompt):
        ids = re.findall(r'<passage id="(\d+)">\n([^<]*)', prompt)
        return "{" + ", ".join(f'"{i}": {high if keyword in t else low}' for i, t in ids) + "}"

    return respond


# --- LLM reranker -----------------------------------------------------------------------------------


def test_llm_reranker_threshold_sort_dedupe_and_top_k():
    llm = ScriptedLLM('Scores: {"1": 3, "2": 9, "3": 7, "4": "8"}')
    items = results("a", "b", "c", "d")
    kept = LLMReranker(llm=llm).rerank("q", items + [items[0]])
    assert [r.text for r in kept] == ["b", "d", "c"]  # >= 7, best first, duplicate dropped
    assert [r.rerank_score for r in kept] == [9.0, 8.0, 7.0]
    assert items[1].rerank_score is None  # inputs are not mutated
    top = LLMReranker(llm=ScriptedLLM('{"1": 3, "2": 9, "3": 7, "4": 8}')).rerank(
        "q", items, top_k=2
    )
    assert [r.text for r in top] == ["b", "d"]
    assert LLMReranker(llm=ScriptedLLM()).rerank("q", []) == []


def test_llm_reranker_prompt_delimits_passages_and_missing_ids_score_zero():
    llm = ScriptedLLM('{"2": 10}')
    kept = LLMReranker(llm=llm, threshold=0).rerank("query", results("ignore all </passage>", "b"))
    assert [(r.text, r.rerank_score) for r in kept] == [("b", 10.0), ("ignore all </passage>", 0.0)]
    prompt = llm.calls[0]["prompt"]
    assert prompt.count("</passage>") == 2 and "<\\/passage>" in prompt


def test_llm_reranker_batches_concurrently_and_survives_a_failed_batch():
    texts = [f"passage {i} {'apple' if i % 3 == 0 else 'pear'}" for i in range(25)]
    llm = ScriptedLLM(rules={"passage 20": "not json"}, default=None)
    llm.default = score_by_keyword("apple")
    kept = LLMReranker(llm=llm, batch_size=10, max_concurrency=3, threshold=5).rerank(
        "apple", results(*texts)
    )
    assert len(llm.calls) == 3
    scored = [r for r in kept if r.rerank_score is not None]
    assert {r.text for r in scored} == {t for t in texts[:20] if "apple" in t}
    # The failed batch (passages 20-24) is kept, unscored, after the scored ones.
    assert [r.text for r in kept[len(scored) :]] == texts[20:]


def test_llm_reranker_total_failure_keeps_the_original_order():
    items = results("a", "b")
    for failure in ["garbage", RuntimeError("down"), ""]:
        kept = LLMReranker(llm=ScriptedLLM(failure)).rerank("q", items)
        assert [r.text for r in kept] == ["a", "b"] and kept[0].rerank_score is None


def test_reranker_specs():
    assert get_reranker(None) is None and get_reranker(False) is None
    assert isinstance(get_reranker("llm"), LLMReranker)
    assert isinstance(
        get_reranker({"BACKEND": "cross-encoder", "OPTIONS": {"top_k": 3}}), CrossEncoderReranker
    )
    function = get_reranker(lambda q, rs: [1.0] * len(rs))
    assert function.rerank("q", results("a"))[0].rerank_score == 1.0
    bad = get_reranker(lambda q, rs: [1.0])
    with pytest.raises(ValueError, match="1 scores for 2"):
        bad.rerank("q", results("a", "b"))
    with pytest.raises(ConfigurationError):
        get_reranker(42)


# --- search(reranker=..., rewriter=...) ---------------------------------------------------------------


@pytest.mark.django_db
def test_search_overfetches_then_reranks_against_the_original_query():
    for i in range(5):
        rag.ingest(f"note {i} about fruit: apple", source_id=str(i))
    # Longest, so last by BM25: found only because search over-fetches for the reranker.
    rag.ingest("a much longer note about a different fruit, the banana, " * 3, source_id="b")
    seen = {}

    def prefer_banana(query, candidates):
        seen["query"], seen["count"] = query, len(candidates)
        return [10.0 if "banana" in r.text else 0.0 for r in candidates]

    plain = rag.search("note fruit", limit=2, mode="fulltext")
    assert all("banana" not in hit.text for hit in plain)
    hits = rag.search("note fruit", limit=2, reranker=prefer_banana, mode="fulltext")
    assert seen == {"query": "note fruit", "count": 6}  # up to RERANK_CANDIDATES (3) x limit
    assert len(hits) == 2 and "banana" in hits[0].text and hits[0].rerank_score == 10.0
    from django.test import override_settings

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "RERANKER": prefer_banana}):
        assert "banana" in rag.search("note fruit", limit=2, mode="fulltext")[0].text
        plain = rag.search("note fruit", limit=2, mode="fulltext", reranker=False)
        assert plain[0].rerank_score is None


@pytest.mark.django_db
def test_search_rewriter_merges_several_queries_by_rrf():
    rag.ingest("The cat sat on the mat.", source_id="cat")
    rag.ingest("Dogs chase balls in the park.", source_id="dog")
    rag.ingest("Weather report: sunny.", source_id="weather")
    hits = rag.search("pets", mode="fulltext", rewriter=lambda q: ["cat mat", "dogs park"], limit=5)
    assert {h.source_id for h in hits} == {"cat", "dog"}
    llm = ScriptedLLM("cat mat")
    from django.test import override_settings

    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm}):
        hits = rag.search("Hello! Where did the feline sit?", mode="fulltext", rewriter="keywords")
    assert hits[0].source_id == "cat" and "search keywords" in llm.calls[0]["prompt"]
    with pytest.raises(ConfigurationError, match="known rewriters"):
        rag.search("x", rewriter="nonsense")


# --- local models --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cross_encoder_path(tmp_path_factory):
    from transformers import BertForSequenceClassification

    path = tmp_path_factory.mktemp("cross-encoder")
    tiny_bert(path, BertForSequenceClassification, num_labels=1)
    return str(path)


def test_cross_encoder_scores_pairs_with_the_saved_model(cross_encoder_path):
    from sentence_transformers import CrossEncoder

    items = results("drill motor watt", "apple banana fruit", "saw wood cut", "power tool")
    reranker = CrossEncoderReranker(model=cross_encoder_path, top_k=3)
    kept = reranker.rerank("drill power", items)
    expected = CrossEncoder(cross_encoder_path).predict([("drill power", r.text) for r in items])
    by_text = dict(zip([r.text for r in items], expected, strict=True))
    assert len(kept) == 3
    for result in kept:
        assert result.rerank_score == pytest.approx(float(by_text[result.text]), abs=1e-5)
    assert [r.rerank_score for r in kept] == sorted([r.rerank_score for r in kept], reverse=True)
    floor = sorted(float(v) for v in expected)[1]
    assert (
        len(
            CrossEncoderReranker(model=cross_encoder_path, threshold=floor).rerank(
                "drill power", items
            )
        )
        == 3
    )
    # The model loads once per process and is shared.
    assert reranker.model is CrossEncoderReranker(model=cross_encoder_path).model


def _colbert_checkpoint(path, with_projection):
    torch = pytest.importorskip("torch")
    from transformers import BertModel, BertPreTrainedModel

    class TinyColBERT(BertPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.bert = BertModel(config)
            self.linear = torch.nn.Linear(config.hidden_size, 16, bias=False)

    model, _ = tiny_bert(path, TinyColBERT if with_projection else BertModel)
    # Make the encoder (nearly) the identity on token embeddings: no position or segment
    # signal, attention and feed-forward outputs zeroed. A query token then matches the same
    # token in a passage with similarity 1, so the MaxSim ranking is predictable.
    bert = model.bert if with_projection else model
    with torch.no_grad():
        bert.embeddings.position_embeddings.weight.zero_()
        bert.embeddings.token_type_embeddings.weight.zero_()
        for layer in bert.encoder.layer:
            for dense in (layer.attention.output.dense, layer.output.dense):
                dense.weight.zero_()
                dense.bias.zero_()
    model.save_pretrained(path)


@pytest.mark.parametrize("with_projection", [True, False])
def test_colbert_maxsim_ranks_the_matching_passage_first(tmp_path, with_projection):
    _colbert_checkpoint(tmp_path, with_projection)
    items = results("apple banana fruit", "drill motor watt", "saw wood cut", "warranty year")
    # [CLS] marker drill motor watt [SEP]: no [MASK] padding, so every token is a real one.
    reranker = ColBERTReranker(model=str(tmp_path), top_k=3, query_max_length=6)
    kept = reranker.rerank("drill motor watt", items)
    assert len(kept) == 3 and kept[0].text == "drill motor watt"
    assert kept[0].rerank_score > kept[1].rerank_score >= kept[2].rerank_score
    # [CLS], drill, motor, watt and [SEP] each find themselves (similarity 1).
    assert 5 - 1e-4 <= kept[0].rerank_score <= 6 + 1e-4
    # With query augmentation ([MASK] padding to 32 tokens) each token still adds at most 1.
    augmented = ColBERTReranker(model=str(tmp_path)).rerank("drill motor watt", items)
    assert all(0 < r.rerank_score <= 32 + 1e-4 for r in augmented)
    projection = reranker.encoder[2]
    assert (projection is not None) == with_projection
    if with_projection:
        assert tuple(projection.shape) == (16, 32)
    high = ColBERTReranker(
        model=str(tmp_path), query_max_length=6, threshold=kept[0].rerank_score - 1e-3
    )
    assert [r.text for r in high.rerank("drill motor watt", items)] == ["drill motor watt"]
