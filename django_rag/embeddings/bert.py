"""A small BERT sentence encoder in plain torch, for the bundled ``all-MiniLM-L6-v2``.

sentence-transformers imports most of transformers (torch's compiler, distributed tensors,
scipy...): about 4 s of CPU before the first vector, where torch alone takes about 1 s. The
bundled model is a 6-layer BERT followed by mean pooling and L2 normalisation, which fits in a
page of torch: this module reads the same ``model.safetensors`` and ``tokenizer.json`` and
computes the same vectors (``tests/test_embeddings.py`` checks them against
``SentenceTransformer.encode`` to 1e-5) without importing transformers or sentence-transformers.

:func:`supports` says whether a model directory has that shape; anything else goes through
sentence-transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_FILES = ("config.json", "modules.json", "tokenizer.json", "model.safetensors")


def _read(path: Path, name: str) -> Any:
    return json.loads((path / name).read_text(encoding="utf-8"))


def supports(path: str | Path) -> bool:
    """Whether ``path`` is a local sentence-transformers directory this encoder reproduces:
    a BERT with absolute positions and GELU, mean pooling, then (optionally) normalisation."""
    path = Path(path)
    if not path.is_dir() or not all((path / name).is_file() for name in _FILES):
        return False
    try:
        config = _read(path, "config.json")
        modules = [m.get("type", "").rsplit(".", 1)[-1] for m in _read(path, "modules.json")]
        pooling_dir = next(
            (
                m.get("path")
                for m in _read(path, "modules.json")
                if m.get("type", "").endswith("Pooling")
            ),
            None,
        )
        pooling = _read(path / pooling_dir, "config.json") if pooling_dir else {}
    except (OSError, ValueError, AttributeError):
        return False
    mean_only = pooling.get("pooling_mode_mean_tokens") and not any(
        value
        for key, value in pooling.items()
        if key.startswith("pooling_mode_") and key != "pooling_mode_mean_tokens"
    )
    return (
        config.get("model_type") == "bert"
        and config.get("hidden_act") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and modules in (["Transformer", "Pooling", "Normalize"], ["Transformer", "Pooling"])
        and bool(mean_only)
    )


class Tokenizer:
    """The model's ``tokenizer.json`` through the ``tokenizers`` package, with the calls the
    embedder makes of a Hugging Face fast tokenizer (``is_fast``, ``__call__`` with offsets)."""

    is_fast = True

    def __init__(self, path: Path, max_length: int):
        from tokenizers import Tokenizer as HFTokenizer

        # Two copies: truncation and padding are state of a tokenizers.Tokenizer, and counting
        # tokens must see the whole text while encoding cuts at the model window.
        self._plain = HFTokenizer.from_file(str(path / "tokenizer.json"))
        self._plain.no_truncation()
        self._plain.no_padding()
        self._batch = HFTokenizer.from_file(str(path / "tokenizer.json"))
        self._batch.enable_truncation(max_length)
        self._batch.no_padding()
        self.max_length = max_length

    def __call__(
        self,
        text: str,
        *,
        add_special_tokens: bool = True,
        return_offsets_mapping: bool = False,
        **_ignored: Any,
    ):
        encoding = self._plain.encode(text, add_special_tokens=add_special_tokens)
        result: dict[str, Any] = {"input_ids": encoding.ids}
        if return_offsets_mapping:
            result["offset_mapping"] = encoding.offsets
        return result

    def encode_batch(self, texts: list[str]):
        """Token ids and attention mask of ``texts`` with special tokens, cut to the window and
        padded to the longest (as sentence-transformers does)."""
        import torch

        encodings = self._batch.encode_batch(texts, add_special_tokens=True)
        width = max(len(e.ids) for e in encodings)
        ids = torch.zeros((len(texts), width), dtype=torch.long)
        mask = torch.zeros((len(texts), width), dtype=torch.long)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids, dtype=torch.long)
            mask[row, : len(encoding.ids)] = 1
        return ids, mask


class BertSentenceEncoder:
    """BERT + mean pooling + L2 normalisation; ``encode`` mirrors the part of
    ``SentenceTransformer.encode`` the embedder uses."""

    def __init__(self, path: str | Path, device: str | None = None):
        import torch
        from safetensors.torch import load_file

        path = Path(path)
        config = _read(path, "config.json")
        settings = (
            _read(path, "sentence_bert_config.json")
            if (path / "sentence_bert_config.json").is_file()
            else {}
        )
        self.device = torch.device(device or "cpu")
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.max_seq_length = int(
            settings.get("max_seq_length") or config.get("max_position_embeddings", 512)
        )
        self.normalize = any(
            m.get("type", "").endswith("Normalize") for m in _read(path, "modules.json")
        )
        weights = load_file(str(path / "model.safetensors"), device=str(self.device))
        # Checkpoints saved from BertForX carry a "bert." prefix; the bundled one does not.
        self.w = {key.removeprefix("bert."): value for key, value in weights.items()}
        self.tokenizer = Tokenizer(path, self.max_seq_length)

    def get_sentence_embedding_dimension(self) -> int:
        return self.hidden

    def _layer_norm(self, x, name: str):
        import torch.nn.functional as F

        return F.layer_norm(
            x, (self.hidden,), self.w[name + ".weight"], self.w[name + ".bias"], self.eps
        )

    def _linear(self, x, name: str):
        import torch.nn.functional as F

        return F.linear(x, self.w[name + ".weight"], self.w[name + ".bias"])

    def forward(self, ids, mask):
        """Sentence vectors of a padded batch (``ids``, ``mask``: [batch, tokens])."""
        import torch
        import torch.nn.functional as F

        w = self.w
        batch, tokens = ids.shape
        head_size = self.hidden // self.heads
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:tokens]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._layer_norm(x, "embeddings.LayerNorm")
        # Padding positions get the lowest float as an additive attention bias, as BERT does.
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min

        def heads(t):
            return t.view(batch, tokens, self.heads, head_size).transpose(1, 2)

        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = heads(self._linear(x, p + "attention.self.query"))
            k = heads(self._linear(x, p + "attention.self.key"))
            v = heads(self._linear(x, p + "attention.self.value"))
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            context = context.transpose(1, 2).reshape(batch, tokens, self.hidden)
            x = self._layer_norm(
                self._linear(context, p + "attention.output.dense") + x,
                p + "attention.output.LayerNorm",
            )
            inner = F.gelu(self._linear(x, p + "intermediate.dense"))
            x = self._layer_norm(
                self._linear(inner, p + "output.dense") + x, p + "output.LayerNorm"
            )
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1) if self.normalize else pooled

    def encode(self, texts: list[str], *, batch_size: int = 32, **_ignored: Any):
        """Vectors of ``texts`` as a float32 numpy array, one row per text, in order."""
        import numpy as np
        import torch

        # Batches of similar lengths pad less (sentence-transformers sorts the same way).
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                ids, mask = self.tokenizer.encode_batch([texts[i] for i in rows])
                vectors = self.forward(ids.to(self.device), mask.to(self.device))
                out[rows] = vectors.float().cpu().numpy()
        return out
