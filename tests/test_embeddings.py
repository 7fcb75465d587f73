import numpy as np
import pytest

from django_rag.embeddings import (
    CallableEmbedder,
    LiteLLMEmbedder,
    SentenceTransformerEmbedder,
    get_embedder,
)
from django_rag.embeddings.sentence_transformers import prefixes_for
from django_rag.exceptions import ConfigurationError
from django_rag.testing import HashingEmbedder

from .stub_openai import StubOpenAI


def cosine(a, b):
    return float(np.dot(a, b))


@pytest.mark.slow
def test_minilm_is_384_dims_unit_norm_and_semantic(minilm):
    assert minilm.dimensions == 384
    docs = minilm.embed_documents(
        [
            "The cat sat on the mat and purred.",
            "A kitten is resting on a rug.",
            "Quarterly revenue grew by twelve percent.",
        ]
    )
    assert all(len(v) == 384 for v in docs)
    assert all(abs(np.linalg.norm(v) - 1.0) < 1e-5 for v in docs)
    assert cosine(docs[0], docs[1]) > cosine(docs[0], docs[2]) + 0.2
    query = minilm.embed_query("feline sleeping on a carpet")
    assert cosine(query, docs[1]) > cosine(query, docs[2])


@pytest.mark.slow
def test_minilm_loads_once_per_process(minilm):
    other = SentenceTransformerEmbedder(model="sentence-transformers/all-MiniLM-L6-v2")
    assert other.model is minilm.model


@pytest.mark.parametrize(
    "model,query,document",
    [
        ("intfloat/e5-small-v2", "query: ", "passage: "),
        ("intfloat/multilingual-e5-large", "query: ", "passage: "),
        ("BAAI/bge-small-en-v1.5", "Represent this sentence for searching relevant passages: ", ""),
        ("BAAI/bge-m3", "", ""),
        ("nomic-ai/nomic-embed-text-v1.5", "search_query: ", "search_document: "),
        ("sentence-transformers/all-MiniLM-L6-v2", "", ""),
        ("thenlper/gte-small", "", ""),
    ],
)
def test_prefixes_by_model_family(model, query, document):
    assert prefixes_for(model) == (query, document)
    embedder = SentenceTransformerEmbedder(model=model)
    assert (embedder.query_prefix, embedder.document_prefix) == (query, document)


def test_prefixes_are_applied_and_overridable():
    seen = []

    class Recording(SentenceTransformerEmbedder):
        def _embed(self, texts):
            seen.extend(texts)
            return [[1.0, 0.0]] * len(texts)

    embedder = Recording(model="intfloat/e5-base-v2")
    embedder.embed_query("hello")
    embedder.embed_documents(["world"])
    custom = Recording(model="intfloat/e5-base-v2", query_prefix="Q: ", document_prefix="")
    custom.embed_query("hello")
    custom.embed_documents(["world"])
    assert seen == ["query: hello", "passage: world", "Q: hello", "world"]


def test_constructing_an_embedder_does_no_io():
    embedder = SentenceTransformerEmbedder(model="/nonexistent/model")
    assert embedder.known_dimensions is None  # nothing loaded, nothing failed


def test_hashing_embedder_is_deterministic_and_word_sensitive():
    embedder = HashingEmbedder()
    a, b, c = embedder.embed_documents(["red apple pie", "apple pie recipe", "tax return form"])
    assert a == embedder.embed_documents(["red apple pie"])[0]
    assert cosine(a, b) > cosine(a, c)
    assert abs(np.linalg.norm(a) - 1) < 1e-6


def test_callable_embedder_normalises_and_batches():
    calls = []

    def embed(texts):
        calls.append(len(texts))
        return [[3.0, 4.0] for _ in texts]

    embedder = get_embedder(embed)
    assert isinstance(embedder, CallableEmbedder)
    embedder.batch_size = 2
    vectors = embedder.embed_documents(["a", "b", "c"])
    assert np.allclose(vectors, [[0.6, 0.8]] * 3)
    assert calls == [2, 1]
    assert embedder.dimensions == 2


def test_callable_embedder_wrong_count_raises():
    embedder = CallableEmbedder(lambda texts: [[1.0]])
    with pytest.raises(ValueError, match="returned 1 vectors for 2 texts"):
        embedder.embed_documents(["a", "b"])


@pytest.mark.parametrize(
    "spec",
    [
        "no.such.module.Embedder",
        "django_rag.embeddings.nothing",
        42,
        {"OPTIONS": {}},
        "django_rag.ingestion.chunkers.TokenChunker",
    ],
)
def test_bad_embedder_specs_name_the_setting(spec):
    with pytest.raises(ConfigurationError, match="EMBEDDER"):
        get_embedder(spec)


def test_embedder_from_dict_with_options():
    embedder = get_embedder({"BACKEND": "hashing", "OPTIONS": {"dimensions": 16}})
    assert embedder.dimensions == 16


def test_litellm_embedder_over_real_http():
    with StubOpenAI(dimensions=384) as stub:
        embedder = LiteLLMEmbedder(
            model="openai/text-embedding-3-small",
            api_base=stub.base_url,
            api_key="sk-secret-value",
            dimensions=384,
        )
        vectors = embedder.embed_documents(["first text", "second text"])
        query = embedder.embed_query("first text")
    assert len(vectors) == 2 and len(vectors[0]) == 384
    assert abs(np.linalg.norm(vectors[0]) - 1) < 1e-5
    assert cosine(query, vectors[0]) > 0.999
    assert stub.requests[0]["body"]["input"] == ["first text", "second text"]
    assert stub.requests[0]["authorization"] == "Bearer sk-secret-value"
    assert "sk-secret-value" not in repr(embedder)


def test_litellm_embedder_retries_rate_limits_and_hides_the_key():
    from django_rag.exceptions import LLMError

    from .stub_openai import Failure

    # The OpenAI SDK under litellm tries each embedding request 3 times on its own (litellm
    # does not pass max_retries through for embeddings); our retries wrap those attempts.
    with StubOpenAI(dimensions=384) as stub:
        embedder = LiteLLMEmbedder(
            model="openai/text-embedding-3-small",
            api_base=stub.base_url,
            api_key="sk-secret-value",
            backoff=0.01,
            max_retries=1,
        )
        stub.embedding_failures = [Failure(429)] * 4  # more than one SDK call absorbs
        assert len(embedder.embed_query("retried")) == 384
        assert len(stub.requests) == 5
        stub.embedding_failures = [Failure(429)] * 6
        with pytest.raises(LLMError, match="after 2 attempt") as info:
            embedder.embed_query("gives up")
        assert "sk-secret-value" not in str(info.value)


# Texts that exercise the tokenizer and the model: accents and case (BERT lower-cases and
# strips accents), CJK, emoji, ligatures, control whitespace, an empty text, one longer than
# the 256-token window (truncated), and batches of different lengths (padding).
EQUIVALENCE_TEXTS = [
    "hello world",
    "Refunds are processed within five business days.",
    "Café naïve résumé — Über Straße, Ångström; 東京タワー 😀 ﬁnance",
    "tab\tnew\nline  spaces\u00a0nbsp \u200b zero-width",
    "",
    "   ",
    "The quick brown fox jumps over the lazy dog. " * 60,
    "Numbers 3.14159 and 1234567890, e-mail a.b@example.org, URL https://x.y/z?q=1",
    "query: what is the refund policy",
]


@pytest.mark.slow
def test_bundled_minilm_without_sentence_transformers_gives_the_same_vectors(minilm):
    from sentence_transformers import SentenceTransformer

    from django_rag.embeddings.bert import BertSentenceEncoder
    from django_rag.embeddings.sentence_transformers import _resolve_path

    assert isinstance(minilm.model, BertSentenceEncoder)  # the default path for the bundle
    reference = SentenceTransformer(_resolve_path("all-MiniLM-L6-v2"), device="cpu")
    for batch_size, engine in ((1, "numpy"), (4, "numpy"), (4, "torch"), (32, None)):
        ours = minilm.model.encode(EQUIVALENCE_TEXTS, batch_size=batch_size, engine=engine)
        theirs = reference.encode(
            EQUIVALENCE_TEXTS,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        assert ours.shape == theirs.shape == (len(EQUIVALENCE_TEXTS), 384)
        assert float(np.abs(ours - theirs).max()) < 1e-5, engine
    # The chunker sizes chunks with the tokenizer: the same ids, offsets and window.
    for text in EQUIVALENCE_TEXTS:
        for special in (False, True):
            ours = minilm.model.tokenizer(
                text, add_special_tokens=special, return_offsets_mapping=True, truncation=False
            )
            theirs = reference.tokenizer(
                text, add_special_tokens=special, return_offsets_mapping=True, truncation=False
            )
            assert ours["input_ids"] == theirs["input_ids"]
            assert [tuple(s) for s in ours["offset_mapping"]] == [
                tuple(s) for s in theirs["offset_mapping"]
            ]
    assert minilm.model.max_seq_length == reference.max_seq_length == 256
    st = SentenceTransformerEmbedder(encoder="sentence-transformers")
    assert isinstance(st.model, SentenceTransformer)
    assert st.max_tokens == minilm.max_tokens == 254
    assert st.count_tokens(EQUIVALENCE_TEXTS[2]) == minilm.count_tokens(EQUIVALENCE_TEXTS[2])
    assert (
        np.abs(
            np.array(st.embed_documents(EQUIVALENCE_TEXTS))
            - minilm.embed_documents(EQUIVALENCE_TEXTS)
        ).max()
        < 1e-5
    )


def test_encoder_option_is_checked():
    from django_rag.exceptions import InvalidOption

    with pytest.raises(InvalidOption, match="encoder must be one of auto, sentence-transformers"):
        SentenceTransformerEmbedder(encoder="onnx")


def test_only_a_bert_mean_pooling_directory_takes_the_light_path(tmp_path):
    import json

    from django_rag.embeddings.bert import supports
    from django_rag.embeddings.sentence_transformers import _light_path, _resolve_path

    bundled = _resolve_path("all-MiniLM-L6-v2")
    assert supports(bundled)
    assert _light_path("all-MiniLM-L6-v2", None, "auto") == bundled
    assert _light_path("all-MiniLM-L6-v2", "cuda", "auto") is None
    assert _light_path("all-MiniLM-L6-v2", None, "sentence-transformers") is None
    assert _light_path("BAAI/bge-small-en-v1.5", None, "auto") is None
    # A copy of the bundle with CLS pooling is not what the light encoder computes.
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(bundled, copy)
    assert supports(copy)
    pooling = json.loads((copy / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (copy / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert not supports(copy)
    assert not supports(tmp_path / "missing")
