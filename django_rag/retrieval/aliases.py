"""Other names for search options: the names Arcana (the Elixir library django_rag follows)
gives options that mean the same as ours, accepted by :func:`~django_rag.search`,
:func:`~django_rag.ask`, :class:`~django_rag.Agent` and :class:`~django_rag.agent.Loop`
(docs/search.md, "Other names for options")."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from ..exceptions import InvalidOption

#: Another name -> our name. Only names whose meaning is ours exactly.
OPTION_ALIASES: dict[str, str] = {
    "collections": "collection",  # a name or a list of names, as collection= takes
    "vector_weight": "semantic_weight",  # hybrid: the weight of the vector side
    "keyword_weight": "fulltext_weight",  # hybrid: the weight of the full-text side
}

P = ParamSpec("P")
R = TypeVar("R")


def resolve_aliases(options: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """``options`` with every alias renamed to our name. Raises
    :class:`~django_rag.exceptions.InvalidOption` when an option is given under both names."""
    resolved = dict(options)
    for alias, name in OPTION_ALIASES.items():
        if alias not in resolved:
            continue
        if name in resolved:
            raise InvalidOption(
                f"{owner} got both {alias}= and {name}=: {alias} is another name for {name}; "
                f"give only one of them."
            )
        resolved[name] = resolved.pop(alias)
    return resolved


def accepts_aliases(owner: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function (or ``__init__``) taking search options so that it also accepts
    them under the names of :data:`OPTION_ALIASES`, renamed before it runs (and before its
    options are checked)."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
            if not OPTION_ALIASES.keys().isdisjoint(kwargs):
                kwargs = resolve_aliases(kwargs, owner)  # type: ignore[assignment]
            return function(*args, **kwargs)

        return wrapped

    return decorate
