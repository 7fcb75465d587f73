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


class FileGatedEmbedder(HashingEmbedder):
    """Hashing vectors, but each batch waits until the file named by
    ``DJANGO_RAG_TEST_GATE_FILE`` exists (a worker process the test can hold mid-job); the
    file named by ``DJANGO_RAG_TEST_GATE_ENTERED`` is created when a batch starts waiting."""

    def _embed(self, texts):
        gate = os.environ.get("DJANGO_RAG_TEST_GATE_FILE")
        entered = os.environ.get("DJANGO_RAG_TEST_GATE_ENTERED")
        if entered:
            with open(entered, "a") as marker:
                marker.write(f"{os.getpid()}\n")
        deadline = time.monotonic() + 120
        while gate and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        return super()._embed(texts)


class GatedEmbedder(HashingEmbedder):
    """Hashing vectors once ``gate`` (a threading.Event) is set; ``entered`` is set when a batch
    starts waiting, so a test knows the job is inside its work. In-process only."""

    def __init__(self, **kwargs):
        import threading

        super().__init__(**kwargs)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def _embed(self, texts):
        self.entered.set()
        if not self.gate.wait(120):
            raise TimeoutError("the test never opened the gate")
        return super()._embed(texts)


class SentenceTransformersMiniLM(SentenceTransformerEmbedder):
    """The bundled MiniLM loaded through sentence-transformers (tests/test_command_startup.py:
    its progress bars must stay off the terminal)."""

    def __init__(self, **options):
        super().__init__(encoder="sentence-transformers", **options)
