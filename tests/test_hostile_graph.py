"""Graph extraction under hostile LLM answers and inputs: NUL and control characters in
names, thousands of entities from one chunk, pathological whitespace, no LLM at all."""

import json
import logging
import time

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.graph.extractors import get_extractor
from django_rag.graph.local_extractors import _CAPITALIZED
from django_rag.models import Entity, Relationship
from django_rag.testing import ScriptedLLM

pytestmark = pytest.mark.django_db


def llm_answering(payload):
    return ScriptedLLM(default=lambda prompt: json.dumps(payload))


def test_nul_and_control_characters_in_llm_entity_names_are_stored_clean():
    payload = {
        "entities": [
            {"name": "Acme\x00 Corp", "type": "organization", "description": "maker\x00 of drills"},
            {"name": "\x00\x01\x02", "type": "other"},  # nothing printable: dropped
            {"name": "Berlin\x1f"},
        ],
        "relationships": [{"source": "Acme\x00 Corp", "target": "Berlin", "type": "in"}],
    }
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm_answering(payload)}):
        document = rag.ingest("Acme Corp is in Berlin.", collection="g", graph=True)
    assert document.chunk_count == 1
    names = sorted(Entity.objects.values_list("name", flat=True))
    assert names == ["Acme Corp", "Berlin"]
    assert Entity.objects.get(name="Acme Corp").description == "maker of drills"
    assert Relationship.objects.count() == 1


def test_entities_and_relationships_per_chunk_are_capped():
    payload = {
        "entities": [{"name": f"Entity {i}"} for i in range(2001)],
        "relationships": [
            {"source": f"Entity {i}", "target": f"Entity {i + 1}", "type": "next"}
            for i in range(2000)
        ],
    }
    settings = {
        "EMBEDDER": "hashing",
        "LLM": llm_answering(payload),
        "GRAPH": {"MAX_ENTITIES_PER_CHUNK": 40, "MAX_RELATIONSHIPS_PER_CHUNK": 30},
    }
    with override_settings(DJANGO_RAG=settings):
        rag.ingest("One chunk naming far too many things.", collection="g", graph=True)
    assert Entity.objects.count() == 40
    assert Relationship.objects.count() == 30


def test_graph_without_an_llm_uses_the_local_extractors_and_says_so(caplog):
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}), caplog.at_level(logging.WARNING):
        document = rag.ingest(
            "Jane Doe met Acme Corp in Berlin. Acme Corp builds drills.", collection="g", graph=True
        )
    assert document.chunk_count == 1
    assert {"acme corp", "jane doe", "berlin"} <= set(
        Entity.objects.values_list("normalized_name", flat=True)
    )
    assert Relationship.objects.filter(type="CO_OCCURS_WITH").exists()
    assert "DJANGO_RAG['LLM'] is not set" in caplog.text
    # An explicit LLM or extractor choice is respected.
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "LLM": llm_answering({})}):
        assert type(get_extractor()).__name__ == "LLMGraphExtractor"


@pytest.mark.parametrize(
    "text",
    [
        "A" + " " * 50_000 + "b",
        "Ab " * 20_000 + "x",
        ("Ab" + "\t" * 5_000) * 4 + "c",
        "Bank of " * 10_000 + "x",
    ],
)
def test_capitalised_phrases_are_found_in_linear_time(text):
    start = time.perf_counter()
    list(_CAPITALIZED.finditer(text))
    assert time.perf_counter() - start < 2  # a budget, generous: linear work is milliseconds


@pytest.mark.parametrize("name", ["bad\x00name", "\udc80"])
def test_graph_services_refuse_hostile_collection_names(name):
    from django_rag.exceptions import InvalidOption
    from django_rag.graph import build_graph, detect_communities, summarize_communities

    for service in (build_graph, detect_communities):
        with pytest.raises(InvalidOption):
            service(name)
    with pytest.raises(InvalidOption):
        summarize_communities(name, llm=ScriptedLLM(default="A summary."))
