"""Deprecated import path: ``ask()`` and its helpers (``answer_messages``,
``parse_citations``, ``make_answer``, ``AnswerStream``) moved to
:mod:`django_rag.answers.service`.

This module *is* ``django_rag.answers.service`` (the same module object), so every name, private
ones included, and every ``monkeypatch`` of one keeps working. Import from
``django_rag.answers.service`` (or ``django_rag.answers``) in new code.
"""

import sys
import warnings

from ..answers import service as _moved

warnings.warn(
    "django_rag.agent.answer is deprecated: import from django_rag.answers.service",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
