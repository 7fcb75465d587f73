"""Component resolution: a pluggable part given as a dotted path, an alias, an instance or a
callable becomes an instance of its base class; a bad one raises
:class:`~django_rag.exceptions.ConfigurationError` naming the setting, the value and the cause.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import ConfigurationError, InvalidInput
from .secrets import redact, scrub_text


def import_string(path: str, *, setting: str) -> Any:
    module_path, _, attr = path.rpartition(".")
    if not module_path:
        raise ConfigurationError(
            setting, path, "expected a dotted path such as 'myapp.rag.MyClass'"
        )
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise ConfigurationError(setting, path, f"cannot import {module_path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ConfigurationError(
            setting, path, f"{module_path!r} has no attribute {attr!r}"
        ) from exc


def build_component(
    spec: Any,
    *,
    setting: str,
    base: type,
    aliases: Mapping[str, str],
    wrap_callable: Callable[[Callable], Any] | None = None,
) -> Any:
    """Turn a component spec into an instance of ``base``.

    ``spec`` may be an instance, a class, an alias, a dotted path (to a class, an instance or a
    callable), a ``{"BACKEND": ..., "OPTIONS": {...}}`` dict, or a plain callable (wrapped by
    ``wrap_callable``). Anything else raises :class:`ConfigurationError` naming ``setting``.
    """
    options: dict[str, Any] = {}
    original = redact(spec)  # errors show the spec; never its secrets
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"BACKEND", "OPTIONS"}
        if "BACKEND" not in spec or unknown:
            raise ConfigurationError(
                setting, original, "a dict needs a 'BACKEND' key and optionally 'OPTIONS'"
            )
        options = dict(spec.get("OPTIONS") or {})
        spec = spec["BACKEND"]
    if isinstance(spec, str):
        spec = import_string(aliases.get(spec, spec), setting=setting)
    if isinstance(spec, base):
        if options:
            raise ConfigurationError(setting, original, "OPTIONS cannot be applied to an instance")
        return spec
    if inspect.isclass(spec):
        if not issubclass(spec, base):
            raise ConfigurationError(
                setting, original, f"{spec.__qualname__} is not a subclass of {base.__qualname__}"
            )
        try:
            return spec(**options)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigurationError | InvalidInput):
                raise
            raise ConfigurationError(setting, original, f"bad OPTIONS: {scrub_text(exc)}") from exc
    if callable(spec) and wrap_callable is not None:
        return wrap_callable(spec, **options)
    raise ConfigurationError(
        setting,
        original,
        f"expected an alias ({', '.join(sorted(aliases))}), a dotted path, a {base.__qualname__} "
        "subclass or instance, or a callable",
    )
