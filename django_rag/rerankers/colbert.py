"""ColBERT-style late interaction: MaxSim over per-token embeddings."""

from __future__ import annotations

import os

from ..embeddings.loading import load_model
from ..exceptions import MissingDependency
from ..results import SearchResult
from .base import Reranker

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _projection(model: str, torch):
    """The checkpoint's ``linear`` layer (ColBERT's token projection), if it has one."""
    from transformers.utils import cached_file

    for filename in _WEIGHT_FILES:
        try:
            path = cached_file(model, filename, _raise_exceptions_for_missing_entries=False)
        except OSError:
            path = None
        if not path or not os.path.exists(path):
            continue
        if filename.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
        for key, tensor in state.items():
            if key == "linear.weight" or key.endswith(".linear.weight"):
                return tensor.float()
        return None
    return None


class ColBERTReranker(Reranker):
    """Scores passages by ColBERT MaxSim: each query token's best match in the passage, summed.

    Works with any ColBERT checkpoint (name or local path): the BERT encoder is loaded with
    transformers and the checkpoint's ``linear`` projection is applied when present. Queries
    are padded with ``[MASK]`` tokens to ``query_max_length`` (ColBERT's query augmentation).
    Scores grow with query length (roughly 0 to the number of query tokens).
    """

    def __init__(
        self,
        *,
        model: str = "colbert-ir/colbertv2.0",
        top_k: int | None = None,
        threshold: float | None = None,
        query_max_length: int = 32,
        document_max_length: int = 256,
        batch_size: int = 16,
        device: str | None = None,
    ):
        super().__init__(top_k=top_k, threshold=threshold)
        self.model_name = model
        self.query_max_length = query_max_length
        self.document_max_length = document_max_length
        self.batch_size = batch_size
        self.device = device

    def _load(self):
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise MissingDependency("transformers", "local", "The ColBERT reranker") from exc
        tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        encoder = AutoModel.from_pretrained(self.model_name).eval()
        projection = _projection(self.model_name, torch)
        device = self.device or "cpu"
        encoder.to(device)
        if projection is not None:
            projection = projection.to(device)
        return tokenizer, encoder, projection

    @property
    def encoder(self):
        return load_model(
            ("colbert", self.model_name, self.device),
            self._load,
            model=self.model_name,
            kind="reranker",
        )

    def preload(self) -> None:
        self.encoder  # noqa: B018  (loads it)

    def _marker(self, tokenizer, token: str) -> int | None:
        token_id = tokenizer.convert_tokens_to_ids(token)
        return None if token_id in (None, tokenizer.unk_token_id) else token_id

    def _encode(self, texts: list[str], *, query: bool):
        import torch

        tokenizer, encoder, projection = self.encoder
        max_length = self.query_max_length if query else self.document_max_length
        marker = self._marker(tokenizer, "[unused0]" if query else "[unused1]")
        batch = tokenizer(
            texts,
            padding="max_length" if query else "longest",
            truncation=True,
            max_length=max_length - (1 if marker is not None else 0),
            return_tensors="pt",
        )
        ids, mask = batch["input_ids"], batch["attention_mask"]
        if marker is not None:
            # ColBERT marks queries and documents with a token right after [CLS].
            ids = torch.cat([ids[:, :1], torch.full_like(ids[:, :1], marker), ids[:, 1:]], 1)
            mask = torch.cat([mask[:, :1], torch.ones_like(mask[:, :1]), mask[:, 1:]], 1)
        if query and tokenizer.mask_token_id is not None:
            ids = ids.masked_fill(mask == 0, tokenizer.mask_token_id)
            mask = torch.ones_like(mask)
        device = next(encoder.parameters()).device
        with torch.inference_mode():
            hidden = encoder(input_ids=ids.to(device), attention_mask=mask.to(device))[0]
            if projection is not None:
                hidden = hidden @ projection.T
            hidden = torch.nn.functional.normalize(hidden, dim=-1)
        return hidden, mask.to(device)

    def score(self, query: str, results: list[SearchResult]) -> list[float]:
        import torch

        query_tokens, _ = self._encode([query], query=True)
        query_tokens = query_tokens[0]
        scores: list[float] = []
        for start in range(0, len(results), self.batch_size):
            texts = [result.text for result in results[start : start + self.batch_size]]
            documents, mask = self._encode(texts, query=False)
            with torch.inference_mode():
                similarity = torch.einsum("qd,btd->bqt", query_tokens, documents)
                similarity = similarity.masked_fill(mask[:, None, :] == 0, float("-inf"))
                scores.extend(similarity.max(dim=2).values.sum(dim=1).tolist())
        return scores
