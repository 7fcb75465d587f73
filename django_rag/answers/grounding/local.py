"""Local grounders: a sentence-transformers ``CrossEncoder`` scoring (chunk, sentence) pairs
(``"cross-encoder"`` / ``"nli"``), and cosine similarity of sentence and chunk embeddings
(``"embedding"``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...exceptions import ConfigurationError
from ...rerankers.cross_encoder import load_cross_encoder
from ...results import GroundedSpan, Grounding, SearchResult
from .base import Grounder, claim_text, make_grounding, split_sentences


def _softmax(row: Sequence[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(v - top) for v in row]
    total = sum(exps)
    return [v / total for v in exps]


def _span_for(
    text: str,
    start: int,
    end: int,
    chunks: Sequence[SearchResult],
    support: Sequence[float],
    contradiction: Sequence[float | None],
    threshold: float,
    contradiction_threshold: float,
) -> GroundedSpan:
    supporting = [i for i, value in enumerate(support) if value >= threshold]
    if supporting:
        ids = [chunks[i].chunk_id for i in sorted(supporting, key=lambda i: -support[i])]
        return GroundedSpan(start, end, text[start:end], "supported", ids, float(max(support)))
    against = [
        i
        for i, value in enumerate(contradiction)
        if value is not None and value >= contradiction_threshold
    ]
    if against:
        ids = [chunks[i].chunk_id for i in sorted(against, key=lambda i: -contradiction[i])]
        best = max(contradiction[i] for i in against)
        return GroundedSpan(start, end, text[start:end], "contradicted", ids, float(best))
    best = max(support) if support else None
    return GroundedSpan(
        start, end, text[start:end], "unsupported", [], None if best is None else float(best)
    )


class CrossEncoderGrounder(Grounder):
    """Scores every (chunk, sentence) pair with a sentence-transformers ``CrossEncoder``
    (any model name or local path; loaded lazily, once per process).

    With an NLI model (several labels) the scores are softmaxed: a sentence is supported when
    a chunk entails it with probability >= ``threshold`` (default 0.5), contradicted when one
    contradicts it with probability >= ``contradiction_threshold`` (default 0.5), else
    unsupported. The labels are found in the model's ``id2label`` (names containing "entail"
    and "contradict"); ``labels={"entailment": 1, "contradiction": 0}`` sets them. With a
    relevance model (one score per pair) a sentence is supported when its best chunk scores
    >= ``threshold`` (default 0.5; the score is the model's output, a probability for models
    with a sigmoid head), never contradicted.
    """

    def __init__(
        self,
        *,
        model: str = "cross-encoder/nli-deberta-v3-xsmall",
        threshold: float | None = None,
        contradiction_threshold: float = 0.5,
        labels: dict[str, int] | None = None,
        batch_size: int = 32,
        max_length: int = 512,
        device: str | None = None,
    ):
        for name, value in (
            ("threshold", threshold),
            ("contradiction_threshold", contradiction_threshold),
        ):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ConfigurationError("GROUNDER", value, f"{name} must be a finite number")
        if labels is not None and (
            not isinstance(labels, dict)
            or "entailment" not in labels
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in labels.values())
        ):
            raise ConfigurationError(
                "GROUNDER", labels, 'labels must be like {"entailment": 1, "contradiction": 0}'
            )
        self.model_name = model
        self.threshold = 0.5 if threshold is None else float(threshold)
        self.contradiction_threshold = float(contradiction_threshold)
        self.labels = labels
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device

    @property
    def model(self):
        return load_cross_encoder(
            self.model_name, max_length=self.max_length, device=self.device, kind="grounder"
        )

    def _label_indices(self, model, width: int) -> tuple[int, int | None]:
        if self.labels is not None:
            entail, contra = self.labels["entailment"], self.labels.get("contradiction")
        else:
            config = getattr(getattr(model, "model", None), "config", None)
            names = {
                int(i): str(name).lower()
                for i, name in (getattr(config, "id2label", None) or {}).items()
            }
            entail = next((i for i, n in names.items() if "entail" in n), None)
            contra = next((i for i, n in names.items() if "contradict" in n), None)
            if entail is None:
                raise ConfigurationError(
                    "GROUNDER",
                    self.model_name,
                    "the model's labels name no entailment class; pass labels={'entailment': "
                    "i, 'contradiction': j}",
                )
        for index in (entail, contra):
            if index is not None and not 0 <= index < width:
                raise ConfigurationError(
                    "GROUNDER", self.labels, f"label index {index} is outside 0..{width - 1}"
                )
        return entail, contra

    def ground(self, text, chunks, *, question: str = "") -> Grounding:
        chunks = list(chunks)
        offsets = split_sentences(text)
        if not offsets:
            return make_grounding([], self.name, ["the answer has no sentence to ground"])
        if not chunks:
            spans = [GroundedSpan(a, b, text[a:b], "unsupported", []) for a, b in offsets]
            return make_grounding(spans, self.name, ["no sources to ground the answer in"])
        model = self.model
        pairs = [(chunk.text, claim_text(text[a:b])) for a, b in offsets for chunk in chunks]
        raw = model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        rows = [list(map(float, row)) if hasattr(row, "__len__") else [float(row)] for row in raw]
        width = len(rows[0])
        if width == 1:
            support = [row[0] for row in rows]
            contradiction: list[float | None] = [None] * len(rows)
        else:
            entail, contra = self._label_indices(model, width)
            # Logits are softmaxed; a model whose head already gives probabilities is not.
            probabilities = [
                row if all(0 <= v <= 1 for v in row) and abs(sum(row) - 1) < 1e-4 else _softmax(row)
                for row in rows
            ]
            support = [p[entail] for p in probabilities]
            contradiction = [None if contra is None else p[contra] for p in probabilities]
        spans = []
        for s, (start, end) in enumerate(offsets):
            window = slice(s * len(chunks), (s + 1) * len(chunks))
            spans.append(
                _span_for(
                    text,
                    start,
                    end,
                    chunks,
                    support[window],
                    contradiction[window],
                    self.threshold,
                    self.contradiction_threshold,
                )
            )
        return make_grounding(spans, f"{self.name}({self.model_name})")


class EmbeddingGrounder(Grounder):
    """A sentence is supported when its embedding's cosine similarity to a chunk's is >=
    ``threshold`` (default 0.6). It measures topical closeness, not entailment: a negated or
    altered claim close to its source passes. Use it only when no NLI model is available."""

    def __init__(self, *, embedder: Any = None, threshold: float = 0.6):
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ConfigurationError("GROUNDER", threshold, "threshold must be a number")
        self.embedder = embedder
        self.threshold = float(threshold)

    def ground(self, text, chunks, *, question: str = "") -> Grounding:
        from ...embeddings import get_embedder

        chunks = list(chunks)
        offsets = split_sentences(text)
        if not offsets:
            return make_grounding([], self.name, ["the answer has no sentence to ground"])
        if not chunks:
            spans = [GroundedSpan(a, b, text[a:b], "unsupported", []) for a, b in offsets]
            return make_grounding(spans, self.name, ["no sources to ground the answer in"])
        embedder = get_embedder(self.embedder)
        sentence_vectors = embedder.embed_documents([claim_text(text[a:b]) for a, b in offsets])
        chunk_vectors = embedder.embed_documents([chunk.text for chunk in chunks])

        def cosine(x, y):
            dot = sum(a * b for a, b in zip(x, y, strict=True))
            norm = math.sqrt(sum(a * a for a in x)) * math.sqrt(sum(b * b for b in y))
            return dot / norm if norm else 0.0

        spans = []
        for (start, end), vector in zip(offsets, sentence_vectors, strict=True):
            similarity = [cosine(vector, other) for other in chunk_vectors]
            spans.append(
                _span_for(
                    text,
                    start,
                    end,
                    chunks,
                    similarity,
                    [None] * len(chunks),
                    self.threshold,
                    1.0,
                )
            )
        return make_grounding(spans, f"{self.name}({embedder.model_name})")
