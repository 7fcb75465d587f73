"""Embedders the Celery worker tests configure by dotted path (the worker is another process)."""

import os
import time

from django_rag.embeddings import SentenceTransformerEmbedder
from django_rag.testing import HashingEmbedder


class SlowFlakyEmbedder(HashingEmbedder):
    """Hashing vectors, ``DJANGO_RAG_TEST_EMBED_DELAY`` seconds per batch; fails once (a
    transient error) while the file named by ``DJANGO_RAG_TEST_FLAKY_FILE`` exists."""

    def _embed(self, texts):
        flaky = os.environ.get("DJANGO_RAG_TEST_FLAKY_FILE")
        if flaky and os.path.exists(flaky):
            os.remove(flaky)
            raise ConnectionError("transient embedding failure")
        time.sleep(float(os.environ.get("DJANGO_RAG_TEST_EMBED_DELAY", "0")))
        return super()._embed(texts)


class SentenceTransformersMiniLM(SentenceTransformerEmbedder):
    """The bundled MiniLM loaded through sentence-transformers (tests/test_command_startup.py:
    its progress bars must stay off the terminal)."""

    def __init__(self, **options):
        super().__init__(encoder="sentence-transformers", **options)
