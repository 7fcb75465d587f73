"""The search modes: one registry of names, read by the search service, the stores, the
commands, the dashboard, the HTTP API and MCP (no module spells a mode as a bare string of its
own). What each mode needs and how each store runs it is one table,
:data:`django_rag.store.search_modes.MODE_TABLE`."""

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
            f"(aliases: {aliases_text()}).",
            mode=value,
        )


#: The modes' names, in the order they are listed (forms, comparisons).
MODES: tuple[str, ...] = tuple(mode.value for mode in SearchMode)
#: Other names accepted for a mode (the one place they are declared).
ALIASES: dict[str, SearchMode] = {"vector": SearchMode.SEMANTIC, "keyword": SearchMode.FULLTEXT}
#: Every name a mode is accepted under: the modes, then their aliases (what the settings
#: check, the HTTP API's schemas and the MCP tools' schemas offer).
NAMES: tuple[str, ...] = (*MODES, *ALIASES)


def aliases_text() -> str:
    """The aliases as a person reads them: "vector = semantic, keyword = fulltext"."""
    return ", ".join(f"{alias} = {mode.value}" for alias, mode in ALIASES.items())


def label(mode: str) -> str:
    """How a mode is named to a person: "Full-text", else the name capitalised."""
    return "Full-text" if mode == SearchMode.FULLTEXT else mode.capitalize()
