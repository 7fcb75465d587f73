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


def _sentences(text, *, format="text"):
    return [part.strip() + "." for part in text.split(".") if part.strip()]


def _words(text, *, format="text", chunk_size=2):
    words = text.split()
    return [" ".join(words[i : i + chunk_size]) for i in range(0, len(words), chunk_size)]


def test_a_function_chunker_refuses_options_it_does_not_take_with_a_typed_error():
    from django_rag.models import Document

    with pytest.raises(InvalidOption) as caught:
        rag.ingest("One. Two.", collection="c", chunker=_sentences, chunk_size=50)
    assert caught.value.code == "invalid_option"
    assert "'_sentences' does not take 'chunk_size'" in str(caught.value)
    assert "add a keyword parameter" in str(caught.value)
    assert not Document.objects.exists()  # refused before anything was written


def test_a_function_chunker_that_declares_the_option_receives_it():
    doc = rag.ingest("a b c d e f", collection="c", chunker=_words, chunk_size=3)
    assert [chunk.text for chunk in doc.chunks.order_by("chunk_index")] == ["a b c", "d e f"]
