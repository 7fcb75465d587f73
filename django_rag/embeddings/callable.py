"""Wraps a plain function as an embedder."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .base import Embedder


class CallableEmbedder(Embedder):
    """An embedder backed by ``func(texts: list[str]) -> list[vector]``.

    The function receives a batch of texts and returns one vector per text.
    """

    def __init__(
        self,
        func: Callable[[list[str]], Sequence[Sequence[float]]],
        *,
        dimensions: int | None = None,
        model_name: str | None = None,
        batch_size: int = 32,
    ):
        self.func = func
        self._dimensions = dimensions
        self.model_name = model_name or getattr(func, "__qualname__", "callable")
        self.batch_size = batch_size

    def _embed(self, texts: list[str]) -> Sequence[Sequence[float]]:
        return self.func(texts)
