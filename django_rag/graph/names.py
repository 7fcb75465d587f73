"""Entity name normalisation: the one key used on both sides of every comparison."""

from __future__ import annotations

import re
import unicodedata

_SEPARATORS = re.compile(r"[_\-]+")
_SPACES = re.compile(r"\s+")


def normalize_name(name: str | None) -> str:
    """``"Two_Year-Limited  Warranty"`` -> ``"two year limited warranty"``.

    Unicode NFKC first (so composed and decomposed accents, full-width letters and ligatures
    agree), then case folding, ``_``/``-`` runs to a space, whitespace runs to one space, trim.
    """
    if not name:
        return ""
    text = unicodedata.normalize("NFKC", str(name)).casefold()
    text = _SEPARATORS.sub(" ", text)
    return _SPACES.sub(" ", text).strip()
