"""The ingest request (django_rag.ingestion.request): every ingest entry point checks its
options and resolves its collection in the same place, so a strict unknown collection and a
misspelt option fail the same way everywhere, before anything is written."""

import dataclasses
import inspect

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import django_rag as rag
from django_rag.exceptions import InvalidOption, UnknownCollection
from django_rag.ingestion.files import ingest_files
from django_rag.ingestion.request import (
    TAKES,
    IngestOptions,
    IngestRequest,
    build_ingest_request,
)
from django_rag.models import Chunk, Collection, Document, Entity, Job
from django_rag.store import next_versions
from django_rag.sync import service as model_sync
from tests.syncapp.models import Note

pytestmark = pytest.mark.django_db

TEXT = "Alice met Bob in Paris. Refunds are issued within fourteen days."


@pytest.fixture
def folder(tmp_path):
    directory = tmp_path / "handbook"
    directory.mkdir()
    (directory / "a.txt").write_text(TEXT)
    (directory / "b.md").write_text("# Bees\n\nCarol keeps bees in Rome.")
    return directory


def entry_points(folder):
    """Each ingest entry point, called with ``options``: the Python functions, background
    ingestion of an upload, folder sync (and its dry run), model sync (one row's job and the
    reconcile batch) and ``rag_ingest`` with and without ``--sync``."""
    file = folder / "a.txt"

    def sync_row(collection=None, strict_collections=None):
        # A row's job: its collection is the registration's ("notes"), strict by the setting.
        note = Note.objects.create(body=TEXT)  # its on_commit job never runs in this test
        strict = {**settings.DJANGO_RAG, "STRICT_COLLECTIONS": bool(strict_collections)}
        with override_settings(DJANGO_RAG=strict):
            (version,) = next_versions(1)
            return model_sync.sync_row("syncapp.note", str(note.pk), version)

    def command(*args, **options):
        # A typed error reaches call_command's caller as CommandError, caused by it.
        try:
            call_command("rag_ingest", *args, quiet=True, **options)
        except CommandError as exc:
            raise exc.__cause__ or exc from exc

    return {
        "ingest": lambda **o: rag.ingest(TEXT, **o),
        "ingest_file": lambda **o: rag.ingest_file(file, **o),
        "ingest_bytes": lambda **o: rag.ingest_bytes(TEXT.encode(), filename="a.txt", **o),
        "ingest_upload": lambda **o: rag.ingest_bytes(
            TEXT.encode(), filename="a.txt", background=True, **o
        ),
        "ingest_many": lambda **o: rag.ingest_many([TEXT, "Second."], **o),
        "ingest_files": lambda **o: ingest_files([file], **o),
        "sync_folder": lambda **o: rag.sync_folder(folder, **o),
        "sync_folder dry run": lambda **o: rag.sync_folder(folder, dry_run=True, **o),
        "model sync row": sync_row,
        "rag_ingest": lambda **o: command(str(file), **o),
        "rag_ingest --sync": lambda **o: command(str(folder), sync=True, **o),
    }


def written():
    return (
        Collection.objects.count(),
        Document.objects.count(),
        Chunk.objects.count(),
        Job.objects.exclude(kind=Job.Kind.SYNC_ROW).count(),
    )


@pytest.mark.parametrize(
    "name",
    [
        "ingest",
        "ingest_file",
        "ingest_bytes",
        "ingest_upload",
        "ingest_many",
        "ingest_files",
        "sync_folder",
        "sync_folder dry run",
        "model sync row",
        "rag_ingest",
        "rag_ingest --sync",
    ],
)
def test_a_strict_unknown_collection_fails_every_entry_point_alike(name, folder):
    call = entry_points(folder)[name]
    before = written()
    with pytest.raises(UnknownCollection) as caught:
        call(collection="missing", strict_collections=True)
    assert caught.value.code == "unknown_collection"
    assert ("notes" if name == "model sync row" else "missing") in str(caught.value)
    assert written() == before


@pytest.mark.parametrize(
    "name",
    ["ingest", "ingest_file", "ingest_many", "ingest_files", "sync_folder", "rag_ingest --sync"],
)
def test_the_strict_setting_applies_to_every_entry_point(name, folder, settings):
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "STRICT_COLLECTIONS": True}
    before = written()
    with pytest.raises(UnknownCollection):
        entry_points(folder)[name](collection="missing")
    assert written() == before
    # An existing collection is written to; per call strict_collections=False overrides.
    Collection.objects.create(name="present")
    entry_points(folder)[name](collection="present")
    assert Document.objects.filter(collection__name="present").exists()
    entry_points(folder)[name](collection="new-one", strict_collections=False)
    assert Collection.objects.filter(name="new-one").exists()


def test_model_sync_reconcile_reports_a_strict_unknown_collection(settings):
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "STRICT_COLLECTIONS": True}
    Note.objects.create(body=TEXT)  # collection "notes", which does not exist
    (report,) = model_sync.reconcile("syncapp.note")
    assert report.failed == 1 and "notes" in report.errors[0], report
    assert not Document.objects.exists() and not Collection.objects.filter(name="notes").exists()


@pytest.mark.parametrize(
    "name",
    [
        "ingest",
        "ingest_file",
        "ingest_bytes",
        "ingest_upload",
        "ingest_many",
        "ingest_files",
        "sync_folder",
        "sync_folder dry run",
    ],
)
def test_a_misspelt_option_fails_every_entry_point_with_a_suggestion(name, folder):
    before = written()
    with pytest.raises(InvalidOption, match=r"unknown option 'chunk_sise'.*'chunk_size'\?"):
        entry_points(folder)[name](collection="docs", chunk_sise=100)
    assert written() == before


def test_rag_ingest_refuses_a_misspelt_option_before_reading(folder):
    # Django's call_command checks the command's options itself (a TypeError, as for every
    # command) before handle() runs: nothing is read or written either.
    before = written()
    with pytest.raises(TypeError, match="chunk_sise"):
        call_command("rag_ingest", str(folder), chunk_sise=100)
    assert written() == before


def test_model_sync_refuses_a_misspelt_option():
    with pytest.raises(InvalidOption, match="did you mean 'source_id'"):
        build_ingest_request("sync", {"collection": "notes", "sourc_id": "x"})


def test_an_option_another_entry_point_takes_is_named_with_those_that_take_it(folder):
    with pytest.raises(InvalidOption, match=r"ingest\(\) does not take 'group_size'.*ingest_many"):
        rag.ingest(TEXT, group_size=8)
    with pytest.raises(InvalidOption, match=r"sync_folder\(\) does not take 'replace'"):
        rag.sync_folder(folder, replace=False)
    with pytest.raises(InvalidOption, match=r"ingest_file\(\) does not take 'format'"):
        rag.ingest_file(folder / "a.txt", format="markdown")
    assert not Document.objects.exists()


def test_on_chunk_error_abort_is_raise(failing_embedder):
    request = build_ingest_request("ingest", {"on_chunk_error": "abort"})
    assert request.on_chunk_error == "raise"
    assert build_ingest_request("ingest", {"on_chunk_error": "skip"}).on_chunk_error == "skip"
    with pytest.raises(InvalidOption, match="raise, skip, abort"):
        build_ingest_request("ingest", {"on_chunk_error": "ignore"})
    # "abort" behaves as "raise": a refused chunk stores nothing.
    text = "".join(f"Sentence number {i} is here. " for i in range(400)) + "POISON at the end."
    from django_rag.exceptions import EmbeddingFailed

    with pytest.raises(EmbeddingFailed):
        rag.ingest(text, collection="c", embedder=failing_embedder, on_chunk_error="abort")
    assert not Document.objects.exists()
    # Queued with a background job, the alias is stored normalised.
    doc = rag.ingest("Short text.", collection="c", background=True, on_chunk_error="abort")
    assert doc.job.params["on_chunk_error"] == "raise"


def test_the_typed_dict_and_the_request_declare_the_same_options():
    hints = IngestOptions.__annotations__
    assert set(hints) == {field.name for field in dataclasses.fields(IngestRequest)}
    assert not IngestOptions.__total__
    # Every entry point takes only declared options, and each declared option has a taker.
    assert set().union(*TAKES.values()) == set(hints)
    # The public calls take the TypedDict as **options (what an IDE shows).
    for function in (rag.ingest, rag.ingest_file, rag.ingest_bytes, rag.ingest_many):
        kwargs = inspect.signature(function).parameters["options"]
        assert kwargs.kind is inspect.Parameter.VAR_KEYWORD
        assert "Unpack[IngestOptions]" in str(kwargs.annotation)
    for function in (ingest_files, rag.sync_folder):
        assert "Unpack[IngestOptions]" in str(inspect.signature(function).parameters["options"])


def _pairs(text):
    names = [word.strip(".,") for word in text.split() if word[:1].isupper()]
    entities = [{"name": name, "type": "thing"} for name in names]
    relationships = [
        {"source": a, "target": b, "type": "NEXT_TO"}
        for a, b in zip(names, names[1:], strict=False)
    ]
    return entities, relationships


def test_per_call_extractors_through_ingest_files_and_sync_folder(folder):
    results = ingest_files([folder / "a.txt"], collection="kb", extractor=_pairs)
    assert isinstance(results[0], Document)
    names = set(Entity.objects.filter(collection__name="kb").values_list("name", flat=True))
    assert {"Alice", "Bob", "Paris"} <= names
    report = rag.sync_folder(
        folder,
        collection="kb2",
        entity_extractor="capitalized",
        relationship_extractor="cooccurrence",
    )
    assert sorted(report.added) == ["a.txt", "b.md"]
    names = set(Entity.objects.filter(collection__name="kb2").values_list("name", flat=True))
    assert {"Bob", "Carol", "Rome"} <= names
    # Refused with graph=False, as on ingest.
    with pytest.raises(InvalidOption, match="leave graph out or pass graph=True"):
        ingest_files([folder / "a.txt"], collection="kb3", graph=False, extractor=_pairs)
    assert not Collection.objects.filter(name="kb3").exists()


def test_a_request_is_frozen_and_resolved():
    request = build_ingest_request("ingest", {"collection": {"name": "x", "description": "D"}})
    assert request.collection == ("x", "D") and request.collection_name == "x"
    assert request.embedder is not None and request.strict_collections is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.replace = True  # type: ignore[misc]
    assert not Collection.objects.filter(name="x").exists()  # building writes nothing


def test_the_memory_store_ingest_takes_the_ingest_options_and_refuses_others():
    from django_rag.exceptions import InvalidOption
    from django_rag.retrieval.stores import MemoryVectorStore

    store = MemoryVectorStore()
    ids = store.ingest("Refunds take fourteen days. " * 40, collection="m", chunk_size=20,
                       chunk_overlap=0, on_chunk_error="abort")  # fmt: skip
    assert len(ids) > 1
    with pytest.raises(InvalidOption, match="chunk_sise.*'chunk_size'"):
        store.ingest("text", chunk_sise=20)
    with pytest.raises(
        InvalidOption, match="MemoryVectorStore.ingest\\(\\) does not take 'replace'"
    ):
        store.ingest("text", replace=True)
