"""The embedder base class."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..signals import span


class Embedder:
    """Turns text into L2-normalised vectors.

    Subclasses implement :meth:`_embed` (a batch of already-prefixed texts to vectors). They may
    override :meth:`count_tokens` and :attr:`max_tokens` when they know their tokenizer, so the
    chunker can size chunks to the model window. ``__init__`` must not do I/O: load models and
    clients lazily.
    """

    #: Name recorded on every chunk this embedder produces.
    model_name: str = ""
    #: Prefixes added before embedding (E5 ``query: `` / ``passage: ``, BGE's instruction...).
    query_prefix: str = ""
    document_prefix: str = ""
    batch_size: int = 32
    #: Output size when given up front (``dimensions=`` option of the built-ins).
    _dimensions: int | None = None

    @property
    def dimensions(self) -> int:
        """Size of the vectors; probes the model when it is not known up front."""
        return self.known_dimensions or len(self.embed_query("dimension probe"))

    @property
    def known_dimensions(self) -> int | None:
        """Dimensions when known without loading anything (used by system checks)."""
        return self._dimensions

    @property
    def max_tokens(self) -> int | None:
        """Largest number of text tokens one input may have, or None when unknown/unbounded."""
        return None

    def count_tokens(self, text: str) -> int | None:
        """Number of model tokens in ``text`` (no special tokens), or None if no tokenizer."""
        return None

    def token_offsets(self, text: str) -> list[tuple[int, int]] | None:
        """Character spans of the model tokens of ``text``, or None if there is no tokenizer."""
        return None

    @property
    def is_loaded(self) -> bool:
        """Whether a call now starts at once (False: it would first load a local model, which
        takes seconds; callers check their input before that)."""
        return True

    def preload(self) -> None:
        """Load a local model now rather than on the first call (``PRELOAD_MODELS``); the
        default does nothing (an API embedder has nothing to load, and no call is made)."""

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed passages for storage."""
        return self._run([self.document_prefix + t for t in texts])

    def embed_query(self, text: str) -> list[float]:
        """Embed one search query."""
        return self._run([self.query_prefix + text])[0]

    def _run(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        with span("embed", model=self.model_name, count=len(texts)) as s:
            for start in range(0, len(texts), self.batch_size):
                batch = texts[start : start + self.batch_size]
                result = self._embed(batch)
                if len(result) != len(batch):
                    raise ValueError(
                        f"{type(self).__name__} returned {len(result)} vectors for "
                        f"{len(batch)} texts"
                    )
                vectors.extend(normalize(v) for v in result)
            s.set(dimensions=len(vectors[0]) if vectors else None)
        return vectors

    def _embed(self, texts: list[str]) -> Sequence[Sequence[float]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} model={self.model_name!r}>"


def normalize(vector: Sequence[float]) -> list[float]:
    array = np.asarray(vector, dtype=np.float32)
    if array.ndim != 1:
        raise ValueError(f"an embedding must be a flat list of numbers, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("an embedding contains NaN or infinite values")
    norm = float(np.linalg.norm(array))
    return (array / norm).tolist() if norm > 0 else array.tolist()
