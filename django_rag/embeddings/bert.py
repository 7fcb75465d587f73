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

import contextlib
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
        """Token ids and attention mask (int64 arrays) of ``texts`` with special tokens, cut
        to the window and padded to the longest (as sentence-transformers does)."""
        import numpy as np

        encodings = self._batch.encode_batch(texts, add_special_tokens=True)
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        return ids, mask


# Batches up to this many token positions (a few queries) run in numpy: a search process then
# never imports torch (about 1 s of CPU). Larger ones (documents) run in torch, which is faster
# there. Both compute the same vectors (tests/test_embeddings.py).
NUMPY_MAX_TOKENS = 256


def _erf(x):
    """erf in numpy (which has none), float64: Abramowitz & Stegun 7.1.26, absolute error
    below 1.5e-7, far under float32 rounding of the activations it feeds."""
    import numpy as np

    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return sign * (1.0 - poly * np.exp(-a * a))


_blas = None


def _one_blas_thread():
    """A context limiting BLAS to one thread (threadpoolctl, which sentence-transformers'
    dependencies install), or a no-op without it."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController

            _blas = ThreadpoolController()
        except Exception:  # not installed, or it cannot inspect this process
            _blas = False
    if _blas is False:
        return contextlib.nullcontext()
    return _blas.limit(limits=1, user_api="blas")


class BertSentenceEncoder:
    """BERT + mean pooling + L2 normalisation; ``encode`` mirrors the part of
    ``SentenceTransformer.encode`` the embedder uses. CPU only."""

    def __init__(self, path: str | Path, device: str | None = None):
        from safetensors.numpy import load_file

        if device not in (None, "cpu"):
            raise ValueError(f"BertSentenceEncoder runs on the CPU, not {device!r}")
        path = Path(path)
        config = _read(path, "config.json")
        settings = (
            _read(path, "sentence_bert_config.json")
            if (path / "sentence_bert_config.json").is_file()
            else {}
        )
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
        weights = load_file(str(path / "model.safetensors"))
        # Checkpoints saved from BertForX carry a "bert." prefix; the bundled one does not.
        self.w = {key.removeprefix("bert."): value for key, value in weights.items()}
        self._torch_w = None  # the same arrays as torch tensors (shared memory), when needed
        self.tokenizer = Tokenizer(path, self.max_seq_length)

    def get_sentence_embedding_dimension(self) -> int:
        return self.hidden

    def forward_numpy(self, ids, mask):
        """Sentence vectors of a padded batch (``ids``, ``mask``: int arrays [batch, tokens])."""
        # One BLAS thread: these products are small, and OpenBLAS's threads spinning for
        # work on a busy machine made a 500-token batch 15 times slower (measured, 2 cores).
        with _one_blas_thread():
            return self._forward_numpy(ids, mask)

    def _forward_numpy(self, ids, mask):
        import numpy as np

        w = self.w
        batch, tokens = ids.shape
        size = self.hidden // self.heads

        def layer_norm(x, name):
            mean = x.mean(-1, keepdims=True)
            var = ((x - mean) ** 2).mean(-1, keepdims=True)
            return (x - mean) / np.sqrt(var + self.eps) * w[name + ".weight"] + w[name + ".bias"]

        def linear(x, name):
            return x @ w[name + ".weight"].T + w[name + ".bias"]

        def heads(t):
            return t.reshape(batch, tokens, self.heads, size).transpose(0, 2, 1, 3)

        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:tokens]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = layer_norm(x, "embeddings.LayerNorm")
        bias = (1.0 - mask[:, None, None, :].astype(np.float32)) * np.finfo(np.float32).min
        scale = np.float32(1.0 / np.sqrt(size))
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = heads(linear(x, p + "attention.self.query"))
            k = heads(linear(x, p + "attention.self.key"))
            v = heads(linear(x, p + "attention.self.value"))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, tokens, self.hidden)
            x = layer_norm(
                linear(context, p + "attention.output.dense") + x,
                p + "attention.output.LayerNorm",
            )
            inner = linear(x, p + "intermediate.dense")
            inner = (0.5 * inner * (1.0 + _erf(inner / np.sqrt(2.0)))).astype(np.float32)
            x = layer_norm(linear(inner, p + "output.dense") + x, p + "output.LayerNorm")
        weights = mask[..., None].astype(np.float32)
        pooled = (x * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32)

    def forward_torch(self, ids, mask):
        """:meth:`forward_numpy` in torch (faster on document batches); numpy in and out."""
        import torch
        import torch.nn.functional as F

        if self._torch_w is None:
            self._torch_w = {key: torch.from_numpy(value) for key, value in self.w.items()}
        w = self._torch_w
        ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
        batch, tokens = ids.shape
        size = self.hidden // self.heads

        def layer_norm(x, name):
            return F.layer_norm(x, (self.hidden,), w[name + ".weight"], w[name + ".bias"], self.eps)

        def linear(x, name):
            return F.linear(x, w[name + ".weight"], w[name + ".bias"])

        def heads(t):
            return t.view(batch, tokens, self.heads, size).transpose(1, 2)

        with torch.inference_mode():
            x = (
                w["embeddings.word_embeddings.weight"][ids]
                + w["embeddings.position_embeddings.weight"][:tokens]
                + w["embeddings.token_type_embeddings.weight"][0]
            )
            x = layer_norm(x, "embeddings.LayerNorm")
            # Padding positions get the lowest float as an additive attention bias, as BERT.
            bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            for i in range(self.layers):
                p = f"encoder.layer.{i}."
                q = heads(linear(x, p + "attention.self.query"))
                k = heads(linear(x, p + "attention.self.key"))
                v = heads(linear(x, p + "attention.self.value"))
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
                context = context.transpose(1, 2).reshape(batch, tokens, self.hidden)
                x = layer_norm(
                    linear(context, p + "attention.output.dense") + x,
                    p + "attention.output.LayerNorm",
                )
                inner = F.gelu(linear(x, p + "intermediate.dense"))
                x = layer_norm(linear(inner, p + "output.dense") + x, p + "output.LayerNorm")
            weights = mask.unsqueeze(-1).to(x.dtype)
            pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            if self.normalize:
                pooled = F.normalize(pooled, p=2, dim=1)
            return pooled.numpy()

    def warm_torch(self) -> None:
        """Import torch and run one batch through it (what preloading asks for: ingestion
        batches run in torch)."""
        ids, mask = self.tokenizer.encode_batch(["warm up"])
        self.forward_torch(ids, mask)

    def encode(
        self, texts: list[str], *, batch_size: int = 32, engine: str | None = None, **_ignored
    ):
        """Vectors of ``texts`` as a float32 numpy array, one row per text, in order.

        ``engine``: ``"numpy"`` or ``"torch"``; None picks numpy for batches of at most
        :data:`NUMPY_MAX_TOKENS` token positions (queries), torch for larger ones."""
        import numpy as np

        # Batches of similar lengths pad less (sentence-transformers sorts the same way).
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            ids, mask = self.tokenizer.encode_batch([texts[i] for i in rows])
            use = engine or ("numpy" if ids.size <= NUMPY_MAX_TOKENS else "torch")
            forward = self.forward_numpy if use == "numpy" else self.forward_torch
            out[rows] = forward(ids, mask)
        return out
