"""Graph stores (PostgreSQL and in-memory run the same contract), relationship metadata, batch
extraction, switching community detection off, detectors that see the whole graph, communities
for isolated entities and the standalone community summary."""

import json
import re

import pytest
from django.test import override_settings

import django_rag as rag
from django_rag.checks import check_settings
from django_rag.exceptions import ConfigurationError, InvalidOption
from django_rag.graph import (
    CommunityDetector,
    GraphQuery,
    LLMGraphExtractor,
    MemoryGraphStore,
    PostgresGraphStore,
    build_graph,
    detect_communities,
    get_graph_store,
    summarize_communities,
    summarize_community,
)
from django_rag.graph.builder import extract_all
from django_rag.graph.extractors import MAX_BATCH_SIZE
from django_rag.graph.search import graph_results
from django_rag.models import Chunk, Collection, Document, Entity, Relationship
from django_rag.store.deletes import delete_document
from django_rag.testing import HashingEmbedder, ScriptedLLM
from tests.helpers import DOCS, KNOWN, respond


def settings(store="postgres", llm=None, **graph):
    return override_settings(
        DJANGO_RAG={
            "EMBEDDER": "hashing",
            "LLM": llm or ScriptedLLM(default=respond),
            "GRAPH": {"ENABLED": True, "STORE": store, **graph},
        }
    )


@pytest.fixture(params=["postgres", "memory"])
def store(request, db):
    """Each contract test runs once per store: the PostgreSQL tables and a fresh memory store."""
    return PostgresGraphStore() if request.param == "postgres" else MemoryGraphStore()


def names(entities):
    return sorted(e.name for e in entities)


def kb(name="kb"):
    return Collection.objects.get(name=name).pk


def words_graph(text):
    """A local extractor: every lower-case word of the text is an entity, each pair related."""
    words = sorted(set(re.findall(r"\b[a-h]\b", text)))
    entities = [{"name": w, "type": "concept"} for w in words]
    edges = [
        {"source": a, "target": b, "type": "NEAR", "strength": 5}
        for i, a in enumerate(words)
        for b in words[i + 1 :]
    ]
    return entities, edges


# --- the contract, once per store ----------------------------------------------------------------


def test_store_persists_entities_once_and_counts_repeated_relationships(store):
    with settings(store):
        for source_id, text in DOCS.items():
            rag.ingest(text, collection="kb", source_id=source_id)
        rag.ingest("Jane Doe still works for Acme_Corp.", collection="kb", source_id="again")
    assert names(store.find([kb()])) == sorted(KNOWN)
    (acme,) = store.find([kb()], names=["acme corp"])
    assert acme.type == "organization" and acme.embedding is not None
    assert len({chunk for chunk, _ in store.mentions([acme.pk])}) == 3
    (works,) = [r for r in store.relationships(kb()) if r.type == "WORKS_FOR"]
    assert works.count == 2 and works.strength == 8
    assert store.counts([kb()]) == {"entities": 6, "relationships": 4}
    assert (Entity.objects.exists()) is isinstance(store, PostgresGraphStore)


def test_store_merges_relationship_metadata_first_value_kept(store):
    replies = iter(
        [
            {"source": "a", "target": "b", "type": "R", "metadata": {"page": 1, "quote": "x"}},
            {"source": "a", "target": "b", "type": "R", "metadata": {"page": 9, "lang": "en"}},
            {"source": "a", "target": "b", "type": "R", "metadata": "not an object"},
        ]
    )

    def extractor(text):
        return ["a", "b"], [next(replies)]

    with settings(store, EXTRACTOR=extractor):
        for i in range(3):
            rag.ingest(f"text {i}", collection="kb", source_id=str(i))
    (edge,) = store.relationships(kb())
    assert edge.metadata == {"page": 1, "quote": "x", "lang": "en"} and edge.count == 3


def test_store_finds_entities_by_embedding_within_collections(store):
    with settings(store):
        rag.ingest(DOCS["acme"], collection="kb")
        rag.ingest(DOCS["globex"], collection="other")
    vector = HashingEmbedder().embed_query("Berlin: about Berlin")
    found = store.search(vector, [kb()], limit=10, threshold=0.3)
    (berlin,) = store.find([kb()], names=["berlin"])
    assert next(iter(found)) == berlin.pk and found[berlin.pk] > 0.9
    assert list(found.values()) == sorted(found.values(), reverse=True)
    assert store.search(vector, [kb("other")], limit=10, threshold=0.99) == {}
    assert len(store.search(vector, None, limit=1, threshold=0.0)) == 1


def test_store_traverses_both_directions_once_per_entity(store):
    with settings(store):
        rag.ingest(DOCS["jane"] + " " + DOCS["acme"], collection="kb")
    ids = {e.normalized_name: e.pk for e in store.find([kb()])}
    scores, hops = store.traverse({ids["berlin"]: 1.0}, 2, 0.5, [kb()])
    # berlin <- acme (hop 1) <- jane, -> x200 drill (hop 2)
    assert hops == {
        ids["berlin"]: 0,
        ids["acme corp"]: 1,
        ids["jane doe"]: 2,
        ids["x200 drill"]: 2,
    }
    assert scores[ids["jane doe"]] == pytest.approx(0.25)
    assert store.traverse({ids["berlin"]: 1.0}, 2, 0.5, [kb() + 99]) == (
        {ids["berlin"]: 1.0},
        {ids["berlin"]: 0},
    )


def test_store_sweeps_orphans_on_delete_and_marks_communities_dirty(store):
    with settings(store, EXTRACTOR=words_graph):
        keep = rag.ingest("a b c", collection="kb", source_id="keep")
        gone = rag.ingest("c d e", collection="kb", source_id="gone")
        rag.ingest("d e", collection="other", source_id="gone")
        detect_communities("kb", min_size=1, seed=1)
        summarize_communities("kb", summarizer=lambda e, r: "summary", levels="all")
        assert all(not c.dirty for c in store.communities([kb()]))
        delete_document(gone.pk)
    assert names(store.find([kb()])) == ["a", "b", "c"]
    assert names(store.find([kb("other")])) == ["d", "e"]  # another collection is untouched
    assert {(r.source_id, r.target_id) for r in store.relationships(kb())} == {
        (a.pk, b.pk) for a in store.find([kb()]) for b in store.find([kb()]) if a.name < b.name
    }
    communities = store.communities([kb()])
    remaining = {e.pk for e in store.find([kb()])}
    assert all(set(c.entity_ids) <= remaining for c in communities)
    assert any(c.dirty for c in communities)
    assert keep.pk and store.sweep(kb()) == 0


def test_store_drops_a_replaced_versions_graph(store):
    with settings(store, EXTRACTOR=words_graph):
        rag.ingest("a b", collection="kb", source_id="s")
        rag.ingest_many([{"text": "c d", "source_id": "t"}], collection="kb")
        rag.ingest("e f", collection="kb", source_id="s", replace=True)
        rag.ingest_many([{"text": "g h", "source_id": "t"}], collection="kb", replace=True)
    assert names(store.find([kb()])) == ["e", "f", "g", "h"]
    assert len(store.relationships(kb())) == 2


def test_graph_search_and_ask_read_the_configured_store(store):
    def matcher(query, collection_ids):
        return [e.pk for e in store.find(collection_ids, names=["globex"])]

    options = {"MIN_MATCH_SCORE": 0.0, "DEPTH": 1, "ENTITY_MATCHER": matcher}
    with settings(store, ScriptedLLM(default=respond), **options):
        for source_id, text in DOCS.items():
            rag.ingest(text, collection="kb", source_id=source_id)
        hits = rag.search("headquarters", collection="kb", graph=True, mode="fulltext")
        answer = rag.ask("Where is Globex?", collection="kb", graph=True)
    assert hits and hits[0].graph_score is not None and "Globex" in hits[0].text
    assert [e.name for e in answer.graph["entities"]] == ["Globex"]
    assert [(r.source.name, r.type, r.target.name) for r in answer.graph["relationships"]] == [
        ("Globex", "LOCATED_IN", "Paris")
    ]


def test_build_graph_is_incremental_in_the_given_store(store):
    with settings("postgres"):
        for source_id, text in DOCS.items():
            rag.ingest(text, collection="kb", source_id=source_id, graph=False)
        llm = ScriptedLLM(default=respond)
        first = build_graph("kb", llm=llm, graph_store=store)
        again = build_graph("kb", llm=llm, graph_store=store)
        rebuilt = build_graph("kb", llm=llm, graph_store=store, resume=False)
    assert (first["chunks"], first["entities"], first["relationships"]) == (3, 6, 4)
    assert again["chunks"] == 0 and rebuilt["chunks"] == 3
    assert store.counts([kb()]) == {"entities": 6, "relationships": 4}


def test_communities_detected_and_summarised_in_the_store(store):
    with settings(store, EXTRACTOR=words_graph):
        rag.ingest("a b c d", collection="kb", source_id="one")
        rag.ingest("e f g h", collection="kb", source_id="two")
        assert detect_communities("kb", seed=7, min_size=2) == {"collections": 1, "communities": 2}
        first = summarize_communities("kb", summarizer=lambda e, r: " / ".join(names(e)))
        again = summarize_communities("kb", summarizer=lambda e, r: "never called")
    assert first == {"communities": 2, "summaries": 2, "failed": 0}
    assert again == {"communities": 2, "summaries": 0, "failed": 0}
    assert sorted(c.summary for c in store.communities([kb()])) == [
        "a / b / c / d",
        "e / f / g / h",
    ]


# --- choosing a store -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_memory_store_setting_shares_one_store_and_writes_no_graph_rows():
    shared = get_graph_store("memory")
    shared.clear()
    try:
        with settings("memory"):
            rag.ingest(DOCS["acme"], collection="kb")
            assert get_graph_store() is shared
        assert names(shared.find([kb()])) == ["Acme Corp", "Berlin", "X200 drill"]
        assert not Entity.objects.exists() and not Relationship.objects.exists()
    finally:
        shared.clear()


@pytest.mark.django_db
def test_per_call_graph_store_wins_over_the_setting_for_search_and_delete():
    memory = MemoryGraphStore()
    with settings("postgres"):
        doc = rag.ingest(DOCS["globex"], collection="kb", graph=False)
        build_graph("kb", llm=ScriptedLLM(default=respond), graph_store=memory)
        assert not Entity.objects.exists() and memory.counts([kb()])["entities"] == 2
        (globex,) = memory.find(names=["globex"])
        chunks = Chunk.objects.filter(collection__name="kb")
        found, match = graph_results(
            "globex", None, chunks, None, depth=1, limit=5, matcher=lambda q, ids: [globex.pk],
            graph_store=memory,
        )  # fmt: skip
        assert [r.chunk_id for r in found] == [chunks.get().pk] and match.store is memory
        assert delete_document(doc.pk, graph_store=memory)
    assert memory.counts([kb()]) == {"entities": 0, "relationships": 0}


@pytest.mark.django_db
def test_search_reads_the_graph_store_given_per_call():
    memory = MemoryGraphStore()
    with settings("postgres"):
        rag.ingest(DOCS["globex"], collection="kb", graph=False)
        build_graph("kb", llm=ScriptedLLM(default=respond), graph_store=memory)
        (globex,) = memory.find(names=["globex"])
        chunk = Chunk.objects.get(collection__name="kb")

        def matcher(query, ids):
            return [globex.pk]

        options = dict(mode="fulltext", collection="kb", graph=True, entity_matcher=matcher)
        with_memory = rag.search("Globex", graph_store=memory, **options)
        assert [r.chunk_id for r in with_memory] == [chunk.pk]
        assert with_memory[0].graph_score is not None  # found through the memory store's graph
        # The configured (PostgreSQL) store holds no graph: the graph list is left out.
        assert rag.search("Globex", **options)[0].graph_score is None


@pytest.mark.django_db
def test_ingest_and_delete_write_to_the_graph_store_given_per_call():
    memory = MemoryGraphStore()
    with settings("postgres", EXTRACTOR=words_graph):
        doc = rag.ingest("a b c", collection="kb", source_id="one", graph=True, graph_store=memory)
        assert not Entity.objects.exists()
        assert names(memory.find([kb()])) == ["a", "b", "c"]
        # A replace forgets the old version's mentions in the same store.
        rag.ingest("a d", collection="kb", source_id="one", replace=True, graph=True,
                   graph_store=memory)  # fmt: skip
        assert names(memory.find([kb()])) == ["a", "d"]
        rag.delete(Document.objects.get(collection__name="kb").pk, graph_store=memory)
        assert memory.counts([kb()]) == {"entities": 0, "relationships": 0}
        assert not Document.objects.filter(pk=doc.pk).exists()


@pytest.mark.django_db
def test_a_per_call_graph_store_is_refused_in_the_background():
    with pytest.raises(InvalidOption, match="GRAPH\\['STORE'\\]"):
        rag.ingest("a b", collection="kb", graph=True, background=True,
                   graph_store=MemoryGraphStore())  # fmt: skip
    assert not Document.objects.exists()


@pytest.mark.parametrize("bad", ["nope", 42, {"BACKEND": "memory", "OPTIONS": {"x": 1}}])
def test_a_bad_graph_store_setting_names_the_setting(bad, db):
    with settings(bad):
        with pytest.raises(ConfigurationError, match="GRAPH.STORE"):
            get_graph_store()
        errors = [e for e in check_settings() if e.id == "django_rag.E002"]
    assert len(errors) == 1 and "GRAPH.STORE" in errors[0].msg


# --- batch extraction --------------------------------------------------------------------------------


def batch_respond(prompt):
    """Answers a several-passage prompt passage by passage with the scripted extraction."""
    found = re.findall(r'<passage id="(\d+)">\n(.*?)\n</passage>', prompt, re.S)
    if not found:
        return respond(prompt)
    return json.dumps(
        {
            "passages": [
                {"id": int(n), **json.loads(respond(f"<passage>{text}</passage>"))}
                for n, text in found
            ]
        }
    )


@pytest.mark.django_db
def test_batch_extraction_reads_several_chunks_per_call():
    llm = ScriptedLLM(default=batch_respond)
    with settings(llm=llm, BATCH_SIZE=2):
        for source_id, text in DOCS.items():
            rag.ingest(text, collection="kb", source_id=source_id, graph=False)
        result = build_graph("kb")
    assert len(llm.calls) == 2  # three chunks, two per call
    assert result["entities"] == 6 and result["relationships"] == 4 and result["failed"] == 0


def test_batch_replies_are_hostile_input():
    texts = ["Acme Corp in Berlin.", "Globex in Paris.", "Jane Doe here."]
    acme = json.loads(respond("<passage>Acme Corp in Berlin.</passage>"))
    reply = {
        "passages": [
            "junk",
            {"id": True, "entities": [{"name": "Bool"}]},
            {"id": 7, "entities": [{"name": "Out Of Range"}]},
            {"id": "1", **acme},
            {"id": 1, "entities": [{"name": "Second Answer For One"}]},
            {"id": 2, "entities": "not a list"},
        ]
        + [{"id": 3, "entities": [{"name": "Flood"}]}] * 10_000
    }
    llm = ScriptedLLM(json.dumps(reply), default=respond)
    extractor = LLMGraphExtractor(llm=llm, batch_size=3)
    results, failed = extract_all(texts, extractor, 1)
    assert failed == 0
    assert [e.name for e in results[0].entities] == ["Acme Corp", "Berlin"]
    # 2 was garbled and 3 only appears past the items looked at: each extracted on its own.
    assert [e.name for e in results[1].entities] == ["Globex", "Paris"]
    assert [e.name for e in results[2].entities] == ["Jane Doe"]
    assert len(llm.calls) == 3


def test_an_unreadable_batch_reply_falls_back_to_one_chunk_per_call():
    llm = ScriptedLLM("no json here", default=respond)
    results, failed = extract_all(
        ["Acme Corp.", "Globex."], LLMGraphExtractor(llm=llm, batch_size=2), 2
    )
    assert failed == 0 and [[e.name for e in r.entities] for r in results] == [
        ["Acme Corp"],
        ["Globex"],
    ]
    assert len(llm.calls) == 3


@pytest.mark.parametrize("size", [0, MAX_BATCH_SIZE + 1, True, "4"])
def test_batch_size_is_bounded(size):
    with pytest.raises(InvalidOption, match="batch_size"):
        extract_all(["a", "b"], LLMGraphExtractor(llm=ScriptedLLM(), batch_size=size), 1)


# --- community detection switched off, rich detectors, isolated entities --------------------------


@pytest.fixture
def clusters(db):
    with settings(EXTRACTOR=words_graph):
        rag.ingest("a b c d", collection="kb", source_id="one")
        rag.ingest("e f g h", collection="kb", source_id="two")
    # A lone entity: mentioned, with no relationship.
    lone = Entity.objects.create(collection_id=kb(), name="lone", normalized_name="lone")
    return lone


@pytest.mark.parametrize("off", [None, False])
def test_community_detection_can_be_switched_off(clusters, off):
    with settings(EXTRACTOR=words_graph):
        detect_communities("kb", seed=7)
        before = sorted(tuple(c.entity_ids) for c in PostgresGraphStore().communities())
        assert detect_communities("kb", detector=off) == {"collections": 0, "communities": 0}
    with settings(COMMUNITY_DETECTOR=off):
        assert detect_communities("kb")["communities"] == 0
    assert sorted(tuple(c.entity_ids) for c in PostgresGraphStore().communities()) == before
    assert len(before) == 2  # left out, the option means the configured Leiden


def test_a_detector_with_three_arguments_gets_the_whole_graph(clusters):
    seen = {}

    def by_type(entities, relationships, options):
        seen.update(
            entities={e.name for e in entities},
            strengths={r.strength for r in relationships},
            metadata=[r.metadata for r in relationships][:1],
            options=options,
        )
        return [[e.pk for e in entities if e.type == "concept"]]

    with settings():
        assert detect_communities("kb", detector=by_type, levels=1)["communities"] == 1
    assert seen["entities"] == set("abcdefgh") | {"lone"} and seen["strengths"] == {5.0}
    assert seen["metadata"] == [{}] and seen["options"]["levels"] == 1

    class Weighted(CommunityDetector):
        def partition(self, entities, relationships, options):
            return [[[r.source_id, r.target_id] for r in relationships if r.count > 1]]

    with settings():
        assert detect_communities("kb", detector=Weighted())["communities"] == 0


def test_isolated_entities_get_a_community_of_their_own_when_asked(clusters):
    with settings():
        detect_communities("kb", seed=7, min_size=2)
        assert not [c for c in PostgresGraphStore().communities() if c.entity_ids == [clusters.pk]]
        detect_communities("kb", seed=7, min_size=2, isolated=True)
        singles = [c for c in PostgresGraphStore().communities() if len(c.entity_ids) == 1]
    assert [c.entity_ids for c in singles] == [[clusters.pk]]
    with settings(ISOLATED_COMMUNITIES=True):
        assert detect_communities("kb", seed=7, min_size=2)["communities"] == 3
    with settings(), pytest.raises(InvalidOption, match="isolated"):
        detect_communities("kb", isolated="yes")


# --- the standalone summary ---------------------------------------------------------------------------


def test_summarize_community_summarises_any_group_and_stores_nothing(clusters):
    entities = list(Entity.objects.filter(name__in="abcd").order_by("pk"))
    relationships = list(Relationship.objects.filter(source__in=entities, target__in=entities))
    llm = ScriptedLLM("  The letters a to d are all near each other.  ")
    with settings():
        text = rag.summarize_community(entities, relationships, llm=llm)
        custom = summarize_community(entities, [], summarizer=lambda e, r: "x\x00" * 20_000)
        with pytest.raises(InvalidOption, match="not a string"):
            summarize_community(entities, [], summarizer=lambda e, r: 42)
    assert text == "The letters a to d are all near each other."
    assert "--[NEAR]-->" in llm.calls[0]["prompt"] and len(custom) == 20_000
    assert "\x00" not in custom and not PostgresGraphStore().communities()


def test_in_memory_graphs_merge_keeping_the_first_spelling():
    first = GraphQuery.from_texts({1: "x"}, extractor=lambda t: (["Acme Corp", "Berlin"], [
        {"source": "Acme Corp", "target": "Berlin", "type": "IN"}
    ]))  # fmt: skip
    second = GraphQuery.from_texts({2: "y"}, extractor=lambda t: (["ACME_corp", "Paris"], [
        {"source": "ACME_corp", "target": "Paris", "type": "IN"},
    ]))  # fmt: skip
    merged = first.merge(second)
    assert merged.entity("acme corp")["name"] == "Acme Corp"
    assert merged.traverse("Acme Corp") == {"berlin": 1, "paris": 1}
    assert merged.chunks_for(["Acme Corp"]) == {1, 2}
    assert first.traverse("Acme Corp") == {"berlin": 1}  # the inputs are unchanged
