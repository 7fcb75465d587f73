"""Deprecated import path: the grounders (``Grounder``, ``LLMGrounder``,
``ground_answer``, ``split_sentences``...) moved to
:mod:`django_rag.answers.grounding`.

This module *is* ``django_rag.answers.grounding`` (the same module object), so every name, private
ones included, and every ``monkeypatch`` of one keeps working. Import from
``django_rag.answers.grounding`` (or ``django_rag.answers``) in new code.
"""

import sys
import warnings

from ..answers import grounding as _moved

warnings.warn(
    "django_rag.agent.grounding is deprecated: import from django_rag.answers.grounding",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
