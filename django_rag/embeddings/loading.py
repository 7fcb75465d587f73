"""Loading local models: once per process, announced, without progress bars.

:func:`load_model` is what the local embedder, the rerankers and the NER extractor load their
weights through. The load is a ``model.load`` telemetry span, which management commands turn
into one ``loading model NAME ...`` line on stderr, and Hugging Face's progress bars are off
while it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from ..signals import span
from ..utils import load_once

T = TypeVar("T")


def load_model(
    key: Hashable,
    loader: Callable[[], T],
    *,
    model: str,
    kind: str,
    hugging_face: bool = True,
) -> T:
    """:func:`load_once` for a model: the load is a ``model.load`` telemetry span (commands
    print one "loading model ..." line from it) with Hugging Face's progress bars silenced.

    ``model``: the name shown to people; ``kind``: ``"embedder"``, ``"reranker"``, ``"ner"``...;
    ``hugging_face``: the loader uses transformers (whose progress bars are then turned off).
    """

    def announced() -> T:
        with span("model.load", model=model, kind=kind), quiet_model_loading(hugging_face):
            return loader()

    return load_once(key, announced)


@contextmanager
def quiet_model_loading(hugging_face: bool = True) -> Iterator[None]:
    """Turn off the progress bars transformers and huggingface_hub draw while a model loads
    (``Loading weights: 100%|...|``, download bars): they land on the terminal of every
    command, even one asked for ``--json``. The previous state is restored afterwards.

    With ``hugging_face`` False only modules already imported are touched (a loader that does
    not use transformers does not pay for importing it here).
    """
    import importlib
    import sys

    def module(name: str):
        if name in sys.modules or hugging_face:
            try:
                return importlib.import_module(name)
            except ImportError:
                return None
        return None

    restore: list[Callable[[], None]] = []
    hub = module("huggingface_hub.utils")
    if hub is not None and hasattr(hub, "are_progress_bars_disabled"):
        if not hub.are_progress_bars_disabled():
            hub.disable_progress_bars()
            restore.append(hub.enable_progress_bars)
    hf_logging = module("transformers.utils.logging")
    if hf_logging is not None and hf_logging.is_progress_bar_enabled():
        hf_logging.disable_progress_bar()
        restore.append(hf_logging.enable_progress_bar)
    try:
        yield
    finally:
        for undo in restore:
            undo()
