"""A hashed bag-of-words embedder: deterministic and offline (alias ``"hashing"``; re-exported
by :mod:`django_rag.testing`, where tests find it)."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np

from .base import Embedder

_WORD = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder(Embedder):
    """A hashed bag-of-words embedder (no model, no network, same output on every machine)."""

    def __init__(self, *, dimensions: int = 384, model_name: str = "hashing-bow"):
        self._dimensions = dimensions
        self.model_name = model_name
        self.batch_size = 256

    def _embed(self, texts: list[str]) -> Sequence[Sequence[float]]:
        return [self._vector(text) for text in texts]

    def _vector(self, text: str) -> np.ndarray:
        vector = np.zeros(self._dimensions, dtype=np.float32)
        for word in set(_WORD.findall(text.lower())):
            h = zlib.crc32(word.encode("utf-8"))
            vector[h % self._dimensions] += 0.5
            vector[(7 * h) % self._dimensions] += 0.3
            vector[(13 * h) % self._dimensions] += 0.2
        if not vector.any():
            # Texts with no words still get a valid (non-zero) direction.
            vector[0] = 1.0
        return vector
