"""GraphRAG: normalisation, extraction, building, sweeps, communities, summaries, graph search,
ask with graph context, global answers, the NER path and the in-memory graph."""

import json
import re

import pytest
from django.db import connection
from django.test import override_settings

import django_rag as rag
from django_rag.exceptions import LLMError, UnknownCollection
from django_rag.graph import (
    CapitalizedEntityExtractor,
    CooccurrenceRelationshipExtractor,
    ExtractedEntity,
    GraphQuery,
    LLMGraphExtractor,
    build_graph,
    detect_communities,
    normalize_name,
    summarize_communities,
)
from django_rag.graph import communities as communities_module
from django_rag.models import Community, Entity, EntityMention, GraphChunk, Relationship
from django_rag.testing import ScriptedLLM
from tests.helpers import DOCS, KNOWN, respond, tiny_bert


def graph_settings(llm=None, **graph):
    return override_settings(
        DJANGO_RAG={
            "EMBEDDER": "hashing",
            "LLM": llm or ScriptedLLM(default=respond),
            "GRAPH": {"ENABLED": True, **graph},
        }
    )


@pytest.fixture
def graph_corpus(db):
    with graph_settings():
        for source_id, text in DOCS.items():
            rag.ingest(text, collection="kb", source_id=source_id)
        yield


# --- names and extraction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("Two_Year_Limited_Warranty", "two year limited warranty"),
        ("two-year  limited\twarranty", "two year limited warranty"),
        ("  Two Year Limited Warranty ", "two year limited warranty"),
        ("Cafe\u0301", "café"),  # decomposed accent == composed
        ("Café", "café"),
        ("ＡＣＭＥ", "acme"),  # full-width letters
        ("STRASSE", "strasse"),
        ("", ""),
        (None, ""),
    ],
)
def test_one_normalisation(raw, key):
    assert normalize_name(raw) == key


@pytest.mark.parametrize(
    "wrap", [lambda j: j, lambda j: f"```json\n{j}\n```", lambda j: f"Here you go: {j} Done."]
)
def test_llm_extractor_parses_every_json_form(wrap):
    payload = json.dumps(
        {
            "entities": [
                {"name": "Acme Corp", "type": "Organization!"},
                "Berlin",
                {"name": "acme_corp"},
            ],
            "relationships": [
                {"source": "Acme Corp", "target": "Berlin", "type": "located in", "strength": "12"},
                {"source": "Acme Corp", "target": "Mars", "type": "x"},  # unknown end
                {"source": "Acme Corp", "target": "acme corp", "type": "self"},  # same entity
            ],
        }
    )
    extraction = LLMGraphExtractor(llm=ScriptedLLM(wrap(payload))).extract("text")
    assert [(e.name, e.type) for e in extraction.entities] == [
        ("Acme Corp", "organization"),
        ("Berlin", "other"),
    ]
    rel = extraction.relationships
    assert [(r.source, r.target, r.type, r.strength) for r in rel] == [
        ("Acme Corp", "Berlin", "LOCATED_IN", 10.0)
    ]


@pytest.mark.parametrize("answer", ["no json at all", "", '{"relationships": []}', "[1, 2]"])
def test_llm_extractor_rejects_malformed_answers(answer):
    with pytest.raises(LLMError):
        LLMGraphExtractor(llm=ScriptedLLM(answer)).extract("text")


def test_local_extractors_need_no_model():
    text = "Jane Doe met Acme Corp staff in New York City. Later, IL-6 levels rose."
    names = [e.name for e in CapitalizedEntityExtractor().extract(text)]
    assert names == ["Jane Doe", "Acme Corp", "New York City", "IL-6"]
    entities = [
        ExtractedEntity("A", span_start=0),
        ExtractedEntity("B", span_start=5),
        ExtractedEntity("C", span_start=500),
    ]
    pairs = CooccurrenceRelationshipExtractor(window=100).extract("", entities)
    assert [(r.source, r.target, r.type) for r in pairs] == [("A", "B", "CO_OCCURS_WITH")]
    assert len(CooccurrenceRelationshipExtractor().extract("", entities)) == 3


# --- building -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_ingest_with_graph_dedupes_entities_mentions_and_relationships(graph_corpus):
    names = dict(Entity.objects.values_list("normalized_name", "name"))
    assert names == {normalize_name(n): n for n in KNOWN}
    acme = Entity.objects.get(normalized_name="acme corp")
    assert acme.type == "organization" and acme.embedding is not None
    assert acme.mentions.count() == 2  # in the jane and acme documents
    works = Relationship.objects.get(type="WORKS_FOR")
    assert (works.source.name, works.target.name, works.count) == ("Jane Doe", "Acme Corp", 1)
    with graph_settings():
        rag.ingest("Jane Doe still works for Acme_Corp.", collection="kb", source_id="again")
    works.refresh_from_db()
    assert works.count == 2 and Relationship.objects.filter(type="WORKS_FOR").count() == 1
    assert Entity.objects.filter(normalized_name="acme corp").count() == 1


@pytest.mark.django_db
def test_a_failed_graph_extraction_leaves_nothing(db):
    def broken(prompt):
        raise KeyError("extractor bug")

    with (
        graph_settings(extractor=None),
        override_settings(
            DJANGO_RAG={
                "EMBEDDER": "hashing",
                "GRAPH": {"ENABLED": True, "EXTRACTOR": lambda text: broken(text)},
            }
        ),
    ):
        with pytest.raises(KeyError):
            rag.ingest("Acme Corp in Berlin.", collection="kb")
    assert not rag.search("Acme", mode="fulltext") and not Entity.objects.exists()


@pytest.mark.django_db
def test_llm_failures_skip_the_chunk_but_keep_the_document(db):
    llm = ScriptedLLM(default="not json")
    with graph_settings(llm):
        doc = rag.ingest("Acme Corp in Berlin.", collection="kb")
    assert doc.chunk_count == 1 and not Entity.objects.exists()


@pytest.mark.django_db
def test_orphan_sweeps_stay_in_their_collection(db):
    with graph_settings():
        a = rag.ingest(DOCS["acme"], collection="a", source_id="acme")
        rag.ingest(DOCS["acme"], collection="b", source_id="acme")
    assert Entity.objects.filter(normalized_name="berlin").count() == 2
    rag.delete(a)
    assert list(
        Entity.objects.filter(normalized_name="berlin").values_list("collection__name", flat=True)
    ) == ["b"]
    assert not Relationship.objects.filter(source__collection__name="a").exists()
    with graph_settings():
        rag.ingest("Globex is in Paris.", collection="b", source_id="acme", replace=True)
    assert set(Entity.objects.values_list("normalized_name", flat=True)) == {"globex", "paris"}


@pytest.mark.django_db
def test_incremental_build_and_rebuild(db):
    for source_id, text in DOCS.items():
        rag.ingest(text, collection="kb", source_id=source_id)  # graph off
    assert not Entity.objects.exists()
    llm = ScriptedLLM(default=respond)
    seen = []
    result = build_graph("kb", llm=llm, progress=lambda done, total: seen.append((done, total)))
    assert result["chunks"] == 3 and seen[-1] == (3, 3)
    assert GraphChunk.objects.count() == 3 and Entity.objects.count() == 6
    assert build_graph("kb", llm=llm)["chunks"] == 0  # nothing new
    assert build_graph("kb", llm=llm, resume=False)["chunks"] == 3
    assert Entity.objects.count() == 6 and Relationship.objects.get(type="MAKES").count == 1
    with pytest.raises(UnknownCollection):
        build_graph("nope", llm=llm)


# --- communities -------------------------------------------------------------------------------------


def two_clusters():
    """Two dense groups of entities joined by one weak edge."""
    with graph_settings(extractor=None, entity_extractor=lambda t: [], relationship_extractor=None):
        pass
    from django_rag.models import Collection

    collection = Collection.objects.create(name="g")
    ids = {}
    for name in "abcdefgh":
        ids[name] = Entity.objects.create(collection=collection, name=name, normalized_name=name).pk
    for group in ("abcd", "efgh"):
        for x in group:
            for y in group:
                if x < y:
                    Relationship.objects.create(
                        source_id=ids[x], target_id=ids[y], type="R", strength=5
                    )
    Relationship.objects.create(source_id=ids["d"], target_id=ids["e"], type="R", strength=1)
    return ids


@pytest.mark.django_db
def test_communities_are_reproducible_with_a_seed(db):
    ids = two_clusters()
    assert detect_communities("g", seed=7, min_size=2)["communities"] == 2
    first = sorted(tuple(c.entity_ids) for c in Community.objects.all())
    assert first == sorted(
        [tuple(sorted(ids[x] for x in "abcd")), tuple(sorted(ids[x] for x in "efgh"))]
    )
    detect_communities("g", seed=7, min_size=2)
    assert sorted(tuple(c.entity_ids) for c in Community.objects.all()) == first

    # A hierarchy that converges before the requested depth yields no duplicate levels.
    edges = [(1, 2, 1.0), (2, 3, 1.0), (1, 3, 1.0), (4, 5, 1.0), (5, 6, 1.0), (4, 6, 1.0)]
    levels = communities_module.leiden_levels(
        edges, resolution=1.0, levels=5, max_cluster_size=1000, seed=1
    )
    assert levels == [[[1, 2, 3], [4, 5, 6]]]
    deeper = communities_module.leiden_levels(
        edges + [(3, 4, 0.1)], resolution=1.0, levels=5, max_cluster_size=2, seed=1
    )
    assert all(a != b for a, b in zip(deeper, deeper[1:], strict=False))


@pytest.mark.django_db
def test_a_failed_detection_keeps_the_old_communities(db, monkeypatch):
    two_clusters()
    detect_communities("g", seed=1)
    before = list(Community.objects.values_list("pk", flat=True))

    def boom(*args, **kwargs):
        raise RuntimeError("leiden crashed")

    monkeypatch.setattr(communities_module, "leiden_levels", boom)
    with pytest.raises(RuntimeError):
        detect_communities("g", seed=1)
    assert list(Community.objects.values_list("pk", flat=True)) == before


@pytest.mark.django_db
def test_summaries_regenerate_only_when_content_changes(db):
    ids = two_clusters()
    detect_communities("g", seed=7, min_size=2)
    llm = ScriptedLLM(
        default=lambda prompt: (
            "Summary of " + ",".join(sorted(re.findall(r"^- (\w) \(", prompt, re.M)))
        )
    )
    assert summarize_communities("g", llm=llm)["summaries"] == 2
    assert len(llm.calls) == 2
    summary = Community.objects.get(entity_ids__contains=[ids["a"]]).summary
    assert summary == "Summary of a,b,c,d"
    # Unchanged: detection again carries the summaries over and nothing is re-summarised.
    detect_communities("g", seed=7, min_size=2)
    assert summarize_communities("g", llm=llm)["summaries"] == 0 and len(llm.calls) == 2
    # Changed relationships only (same members): the fingerprint differs, so re-summarise.
    Relationship.objects.filter(source_id=ids["a"], target_id=ids["b"]).update(description="new")
    result = summarize_communities("g", llm=llm)
    assert result["summaries"] == 1 and len(llm.calls) == 3
    # Changed membership: a new community (no carry-over), summarised.
    Relationship.objects.filter(source_id=ids["d"], target_id=ids["e"]).delete()
    Entity.objects.filter(pk=ids["h"]).delete()
    detect_communities("g", seed=7, min_size=2)
    assert summarize_communities("g", llm=llm)["summaries"] == 1
    assert Community.objects.get(entity_ids__contains=[ids["e"]]).summary == "Summary of e,f,g"
    assert summarize_communities("g", llm=llm, force=True)["summaries"] == 2


@pytest.mark.django_db
def test_dirty_threshold_and_level_validation(db):
    two_clusters()
    detect_communities("g", seed=7, min_size=2)
    llm = ScriptedLLM(default="A summary.")
    summarize_communities("g", llm=llm)
    Community.objects.update(change_count=10)
    assert summarize_communities("g", llm=llm, threshold=10)["summaries"] == 2
    from django_rag.exceptions import InvalidOption

    with pytest.raises(InvalidOption):
        summarize_communities("g", llm=llm, levels=[-1])


# --- graph search, ask, global ------------------------------------------------------------------------


@pytest.mark.django_db
def test_graph_search_finds_chunks_through_relationships_within_scope(graph_corpus):
    with graph_settings():
        rag.ingest(DOCS["jane"], collection="other", source_id="jane")
        plain = rag.search("zzz unrelated words", collection="kb", mode="fulltext")
        assert plain == []
        hits = rag.search(
            "Jane Doe",
            collection="kb",
            mode="fulltext",
            graph=True,
            graph_depth=1,
            entity_matcher=lambda q, cols: [
                Entity.objects.get(collection__name="kb", normalized_name="jane doe").pk
            ],
        )
    sources = [h.source_id for h in hits]
    assert sources[0] == "jane" and "acme" in sources  # Acme Corp is one hop away
    assert "globex" not in sources
    assert {h.collection for h in hits} == {"kb"}
    jane = hits[0]
    assert jane.graph_score == pytest.approx(1.5)  # Jane Doe (1) + Acme Corp one hop away (0.5)
    # Fusion: rank 1 on both lists, the graph list weighing GRAPH["WEIGHT"] (0.75).
    assert jane.score == pytest.approx((1 + 0.75) / 61)
    acme = next(h for h in hits if h.source_id == "acme")
    assert acme.graph_score == pytest.approx(0.5)  # one hop, decay 0.5
    with graph_settings():
        scoped = rag.search(
            "Jane Doe",
            collection="kb",
            source_id="jane",
            mode="fulltext",
            graph=True,
            graph_depth=2,
        )
    assert {h.source_id for h in scoped} == {"jane"}


@pytest.mark.django_db
def test_embedding_matcher_and_depth_validation(graph_corpus):
    from django_rag.exceptions import InvalidOption

    with graph_settings():
        hits = rag.search("Globex: about Globex", collection="kb", graph=True)
        assert hits[0].source_id == "globex" and hits[0].graph_score is not None
        with pytest.raises(InvalidOption):
            rag.search("x", graph=True, graph_depth=-1)


@pytest.mark.django_db
def test_ask_with_graph_context_and_global_answers(graph_corpus):
    detect_communities("kb", seed=3, min_size=2)
    summarize_communities("kb", llm=ScriptedLLM(default="Acme Corp, a Berlin maker of drills."))
    llm = ScriptedLLM("Jane works at Acme [1].")
    with graph_settings():
        answer = rag.ask(
            "Jane Doe",
            llm=llm,
            collection="kb",
            graph=True,
            graph_depth=1,
            mode="fulltext",
            entity_matcher=lambda q, cols: list(
                Entity.objects.filter(
                    normalized_name="jane doe", collection__name="kb"
                ).values_list("pk", flat=True)
            ),
        )
    prompt = llm.calls[0]["prompt"]
    assert "<knowledge_graph>" in prompt and "- Jane Doe (person)" in prompt
    assert "Jane Doe --[WORKS_FOR]--> Acme Corp" in prompt
    assert "Acme Corp, a Berlin maker of drills." in prompt
    assert answer.to_dict()["graph"]["entities"] == ["Jane Doe"]
    mapper = ScriptedLLM(
        rules={
            "List the points": '[{"point": "Acme makes drills", "score": 90}]',
            "Key points": "Mostly drills.",
        }
    )
    result = rag.ask(
        "What is this collection about?", llm=mapper, collection="kb", global_search=True
    )
    assert result.text == "Mostly drills." and "Acme makes drills" in mapper.calls[-1]["prompt"]
    agent = rag.Agent("What is this about?", llm=mapper).global_answer(collection="kb")
    assert agent.context.answer == "Mostly drills." and agent.context.error is None


@pytest.mark.django_db
def test_global_answer_without_summaries_says_what_to_do(graph_corpus):
    from django_rag.exceptions import InvalidInput

    with pytest.raises(InvalidInput, match="rag_graph detect-communities"):
        rag.ask("themes?", llm=ScriptedLLM(), global_search=True)


# --- the NER path, in-memory graph, command ---------------------------------------------------------


def tiny_ner(tmp_path) -> str:
    """A token-classification model that tags every word as the start of an organisation."""
    torch = pytest.importorskip("torch")
    from transformers import BertForTokenClassification

    labels = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    model, _ = tiny_bert(
        tmp_path,
        BertForTokenClassification,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    with torch.no_grad():  # every token is the start of an organisation
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0, 0, 0, 9.0, 0, 0, 0, 0, 0]))
    model.save_pretrained(tmp_path)
    return str(tmp_path)


def test_ner_extractor_with_a_tiny_local_model(tmp_path):
    from django_rag.graph import NEREntityExtractor

    path = tiny_ner(tmp_path)
    entities = NEREntityExtractor(model=path).extract("drill motor saw")
    assert [(e.name, e.type) for e in entities] == [
        ("drill", "organization"),
        ("motor", "organization"),
        ("saw", "organization"),
    ]
    assert (entities[1].span_start, entities[1].span_end) == (6, 11)


@pytest.mark.django_db
def test_ner_entity_matcher_with_the_tiny_model(tmp_path):
    from django_rag.graph.search import match_entities
    from django_rag.models import Collection

    path = tiny_ner(tmp_path)
    collection = Collection.objects.create(name="n")
    drill = Entity.objects.create(collection=collection, name="Drill", normalized_name="drill")
    Entity.objects.create(collection=collection, name="Wood", normalized_name="wood")
    ner = {"BACKEND": "ner", "OPTIONS": {"model": path}}
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing", "GRAPH": {"ENTITY_EXTRACTOR": ner}}):
        assert match_entities("drill motor", None, None, matcher="ner") == {drill.pk: 1.0}
        assert match_entities("drill motor", None, [collection.pk + 1], matcher="ner") == {}


def test_in_memory_graph_queries():
    graph = GraphQuery.from_texts(
        {"c1": DOCS["jane"], "c2": DOCS["acme"]},
        LLMGraphExtractor(llm=ScriptedLLM(default=respond)),
    )
    assert graph.find("acme_corp") == ["acme corp"]
    assert graph.find("corp", fuzzy=True) == ["acme corp"]
    assert graph.traverse("Jane Doe", depth=2) == {"acme corp": 1, "berlin": 2, "x200 drill": 2}
    assert graph.chunks_for(["Berlin", "Jane Doe"]) == {"c1", "c2"}
    assert graph.entity("jane doe")["type"] == "person"
    graph.summaries.append({"level": 0, "summary": "S", "entities": ["berlin"]})
    assert graph.summaries_at(0, entity="Berlin") == ["S"] and graph.summaries_at(1) == []


@pytest.mark.django_db
def test_in_memory_graph_from_a_collection(graph_corpus):
    graph = GraphQuery.from_collection("kb")
    assert graph.traverse("Globex") == {"paris": 1}
    assert len(graph.chunks_for(["Acme Corp"])) == 2


@pytest.mark.django_db
def test_rag_graph_command(graph_corpus):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = StringIO()
    with graph_settings():
        call_command("rag_graph", "rebuild", "--collection", "kb", "--quiet", stdout=out)
        call_command(
            "rag_graph", "detect-communities", "--seed", "3", stdout=out, stderr=StringIO()
        )
        call_command(
            "rag_graph", "summarize-communities", "--levels", "0", stdout=out, stderr=StringIO()
        )
    text = out.getvalue()
    assert (
        "Processed 3 chunks (0 skipped" in text
        and "holds 6 entities" in text
        and "Detected" in text
        and "Summarised" in text
    )
    with override_settings(DJANGO_RAG={"EMBEDDER": "hashing"}):
        with pytest.raises(CommandError, match=r"DJANGO_RAG\['LLM'\]"):
            call_command("rag_graph", "summarize-communities", stdout=StringIO(), stderr=StringIO())
        with pytest.raises(CommandError):
            call_command("rag_graph", "summarize-communities", "--levels", "-1")
    assert connection.vendor == "postgresql"
    assert EntityMention.objects.count() >= 6
