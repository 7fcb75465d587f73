import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
def minilm():
    """The real bundled all-MiniLM-L6-v2 embedder (loaded once for the session)."""
    from django_rag.embeddings import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder()
    embedder.embed_query("warm up")
    return embedder


@pytest.fixture
def hashing():
    from django_rag.testing import HashingEmbedder

    return HashingEmbedder()


class FailingEmbedder:
    """Wraps an embedder and raises on any text containing ``marker``."""

    def __new__(cls, inner, marker):
        from django_rag.embeddings import Embedder

        class _Failing(Embedder):
            model_name = inner.model_name
            batch_size = 4

            def _embed(self, texts):
                for text in texts:
                    if marker in text:
                        raise RuntimeError("provider refused this input")
                return inner._embed(texts)

        return _Failing()


@pytest.fixture
def failing_embedder(hashing):
    return lambda marker: FailingEmbedder(hashing, marker)
