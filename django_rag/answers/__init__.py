"""The answer layer: answers with citations, written from retrieved chunks, and grounding.

It sits between retrieval and the agent: :func:`ask` answers a question from
:func:`django_rag.search`'s chunks without any agent, and the agent's ``answer`` and ``ground``
steps use the same prompts (:mod:`django_rag.answers.prompts`), citation parsing
(:mod:`django_rag.answers.service`) and grounders (:mod:`django_rag.answers.grounding`)::

    from django_rag.answers import ask, ground_answer
    answer = ask("How do refunds work?", collection="docs", ground=True)
"""

from __future__ import annotations

from .grounding import (
    CrossEncoderGrounder,
    EmbeddingGrounder,
    Grounder,
    LLMGrounder,
    get_grounder,
    ground_answer,
    ground_text,
)
from .service import Answer, AnswerStream, Citation, ask, parse_citations

__all__ = [
    "Answer",
    "AnswerStream",
    "Citation",
    "CrossEncoderGrounder",
    "EmbeddingGrounder",
    "Grounder",
    "LLMGrounder",
    "ask",
    "get_grounder",
    "ground_answer",
    "ground_text",
    "parse_citations",
]
