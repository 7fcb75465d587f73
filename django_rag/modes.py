"""The search modes: one registry, read by the search service, the stores, the commands and
the dashboard (no module spells a mode as a bare string of its own)."""

from __future__ import annotations

import enum

from .exceptions import InvalidSearchMode


class SearchMode(enum.StrEnum):
    """How a search ranks chunks. A ``str``: ``SearchMode.HYBRID == "hybrid"``."""

    SEMANTIC = "semantic"  # cosine similarity of embeddings
    FULLTEXT = "fulltext"  # BM25 over PostgreSQL text search
    HYBRID = "hybrid"  # both, fused

    @property
    def label(self) -> str:
        """How the mode is named to a person (forms, tables)."""
        return label(self.value)

    @property
    def uses_vector(self) -> bool:
        """Whether a search in this mode needs the query's embedding."""
        return self is not SearchMode.FULLTEXT

    @property
    def uses_text(self) -> bool:
        """Whether a search in this mode ranks by full-text relevance."""
        return self is not SearchMode.SEMANTIC

    @classmethod
    def parse(cls, value: object) -> SearchMode:
        """The mode ``value`` names (a mode, its name or an alias of :data:`ALIASES`); anything
        else raises :class:`~django_rag.exceptions.InvalidSearchMode` listing the modes."""
        if isinstance(value, str):
            value = ALIASES.get(value, value)
            try:
                return cls(value)
            except ValueError:
                pass
        raise InvalidSearchMode(
            f"Unknown search mode {value!r}. Available modes: {', '.join(MODES)} "
            f"(aliases: {', '.join(f'{a}={m}' for a, m in ALIASES.items())}).",
            mode=value,
        )


#: The modes' names, in the order they are listed (forms, comparisons).
MODES: tuple[str, ...] = tuple(mode.value for mode in SearchMode)
#: Other names accepted for a mode (the one place they are declared).
ALIASES: dict[str, SearchMode] = {"vector": SearchMode.SEMANTIC, "keyword": SearchMode.FULLTEXT}


def label(mode: str) -> str:
    """How a mode is named to a person: "Full-text", else the name capitalised."""
    return "Full-text" if mode == SearchMode.FULLTEXT else mode.capitalize()
