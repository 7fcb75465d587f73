"""Parity defects (issue 25): each reproduced against real PostgreSQL, then fixed at its root."""

import pytest

import django_rag as rag
from django_rag.exceptions import InvalidOption
from django_rag.testing import ScriptedLLM

pytestmark = pytest.mark.django_db


def test_ask_with_an_unknown_option_raises_invalid_option_naming_it():
    rag.ingest("Refunds are paid within 14 days.", collection="policies")
    llm = ScriptedLLM("unused")
    with pytest.raises(InvalidOption) as caught:
        rag.ask("refunds?", llm=llm, chunk_cap=3)
    message = str(caught.value)
    assert "ask() got an unknown option 'chunk_cap'" in message
    assert "reranker" in message and "run_search" not in message
    with pytest.raises(InvalidOption, match="did you mean 'reranker'"):
        rag.ask("refunds?", llm=llm, rerankr=False)
    assert llm.calls == []  # refused before any LLM call
