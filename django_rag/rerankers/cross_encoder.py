"""A sentence-transformers cross-encoder scoring (query, passage) pairs."""

from __future__ import annotations

from ..embeddings.loading import load_model
from ..exceptions import MissingDependency
from ..results import SearchResult
from .base import Reranker


class CrossEncoderReranker(Reranker):
    """Scores each (query, passage) pair with a ``CrossEncoder`` (any model name or path).

    The model loads lazily, once per process. Scores are the model's raw outputs (logits for
    the MS MARCO models, so they can be negative): prefer ``top_k`` to a ``threshold``.
    """

    def __init__(
        self,
        *,
        model: str = "cross-encoder/ms-marco-MiniLM-L-6-v2",
        top_k: int | None = None,
        threshold: float | None = None,
        batch_size: int = 32,
        max_length: int = 512,
        device: str | None = None,
    ):
        super().__init__(top_k=top_k, threshold=threshold)
        self.model_name = model
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device

    @property
    def model(self):
        return load_cross_encoder(
            self.model_name, max_length=self.max_length, device=self.device, kind="reranker"
        )

    def preload(self) -> None:
        self.model  # noqa: B018  (loads it)

    def score(self, query: str, results: list[SearchResult]) -> list[float]:
        scores = self.model.predict(
            [(query, result.text) for result in results],
            batch_size=self.batch_size,
            show_progress_bar=False,
        )
        return [float(value) for value in scores]


def load_cross_encoder(name: str, *, max_length: int, device: str | None, kind: str):
    """A sentence-transformers ``CrossEncoder``, loaded once per process for every component
    (``kind``: ``"reranker"``, ``"grounder"``) that names the same model, length and device."""

    def load():
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise MissingDependency(
                "sentence-transformers", "local", f"The cross-encoder {kind}"
            ) from exc
        return CrossEncoder(name, max_length=max_length, device=device)

    return load_model(("cross-encoder", name, max_length, device), load, model=name, kind=kind)
