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
