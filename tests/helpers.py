"""Helpers shared by the test modules: a module imports them from here, not from another
test module (which would tie the two together and run that module's set-up on import).
Shared fixtures (the Celery ``broker`` and ``worker``, ``minilm``...) are in conftest.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django.urls import reverse

import django_rag as rag
from django_rag.graph import normalize_name
from django_rag.models import Collection, Community, Entity, Relationship
from django_rag.store import recount_statistics

ROOT = Path(__file__).resolve().parent.parent

# --- documents ------------------------------------------------------------------------------------


def make_pdf(pages: list[str], **save_options) -> bytes:
    """A PDF with one page per text (an empty text: a page with a drawing and no text)."""
    import pymupdf  # an optional extra: only the tests that make a PDF need it

    document = pymupdf.open()
    for text in pages:
        page = document.new_page()
        if text:
            page.insert_textbox(pymupdf.Rect(50, 50, 550, 800), text, fontsize=11)
        else:
            page.draw_rect(pymupdf.Rect(100, 100, 300, 300), color=(0, 0, 0), fill=(0.5, 0.5, 0.5))
    document.set_metadata({"title": "Generated Test PDF"})
    data = document.tobytes(**save_options)
    document.close()
    return data


# --- the graph: a small corpus and a scripted extraction LLM --------------------------------------

KNOWN = {
    "Acme Corp": "organization",
    "Jane Doe": "person",
    "Berlin": "location",
    "X200 drill": "product",
    "Globex": "organization",
    "Paris": "location",
}
EDGES = [
    ("Jane Doe", "acme_corp", "works for"),
    ("Acme Corp", "Berlin", "LOCATED_IN"),
    ("Acme Corp", "X200 drill", "makes"),
    ("Globex", "Paris", "located in"),
]


def respond(prompt: str) -> str:
    """A scripted extraction LLM: finds the known names in the passage (and summarises)."""
    if "<passage>" not in prompt:
        return "A short summary."
    passage = prompt.split("<passage>")[1].split("</passage>")[0].lower()
    present = {n for n in KNOWN if n.lower() in passage or n.lower().replace(" ", "_") in passage}
    entities = [{"name": n, "type": KNOWN[n], "description": f"about {n}"} for n in sorted(present)]
    relationships = [
        {"source": a, "target": b, "type": t, "strength": 8}
        for a, b, t in EDGES
        if normalize_name(a) in {normalize_name(p) for p in present}
        and normalize_name(b) in {normalize_name(p) for p in present}
    ]
    return json.dumps({"entities": entities, "relationships": relationships})


DOCS = {
    "jane": "Jane Doe works for Acme Corp as an engineer.",
    "acme": "Acme Corp is based in Berlin and makes the X200 drill.",
    "globex": "Globex has its headquarters in Paris.",
}


# --- local models ---------------------------------------------------------------------------------

TINY_BERT_WORDS = (
    "the a drill motor watt saw wood cut apple banana fruit warranty year power tool".split()
)


def tiny_bert(path, model_class, **config):
    """A one-layer BERT ``model_class`` over a tiny vocabulary, saved with its tokenizer under
    ``path`` (a local cross-encoder or embedder for tests; needs torch and transformers)."""
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, PreTrainedTokenizerFast

    torch.manual_seed(0)
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "[unused0]",
        "[unused1]",
        *TINY_BERT_WORDS,
    ]
    wordpiece = Tokenizer(
        models.WordPiece(vocab={w: i for i, w in enumerate(vocab)}, unk_token="[UNK]")
    )
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=wordpiece,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    assert tokenizer("drill motor")["input_ids"] == [2, 9, 10, 3]
    bert_config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=128,
        **config,
    )
    model = model_class(bert_config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


# --- the agent: default prompts' markers and a corpus in two collections --------------------------

# Substrings that identify each default prompt (used as ScriptedLLM rules).
GATE = "requires looking things up"
REWRITE = "clean search query"
EXPAND = "Broaden this search query"
DECOMPOSE = "self-contained sub-questions"
SELECT = "Choose the document collections"
SUFFICIENT = "contain enough information to answer"
REQUERY = "did not find enough"
RERANK = "Rate how well each passage"
JUDGE = "Review an answer against"
CORRECT = "A reviewer checked"
ANSWER = "You answer the user's question"

AGENT_DOCS = {
    "products": {
        "x100": "The X100 drill has a 750 watt motor and weighs 2.1 kilograms.",
        "x200": "The X200 drill has a 1200 watt motor and a two year warranty.",
        "saw": "The circular saw S5 cuts wood up to 65 millimetres deep.",
    },
    "hr": {
        "leave": "Employees get 25 days of paid annual leave per year.",
        "remote": "Staff may work remotely up to three days a week.",
    },
}


def ingest_agent_corpus():
    """AGENT_DOCS in two described collections (the agent tests' ``corpus``)."""
    for collection, docs in AGENT_DOCS.items():
        for source_id, text in docs.items():
            rag.ingest(text, collection=collection, source_id=source_id)
    Collection.objects.filter(name="products").update(description="Manuals of our power tools")
    Collection.objects.filter(name="hr").update(description="Human resources policies")


# --- the dashboard --------------------------------------------------------------------------------


def url(name, *args):
    """The dashboard's URL called ``name``."""
    return reverse(f"django_rag_dashboard:{name}", args=args)


# --- BM25 statistics ------------------------------------------------------------------------------


def assert_statistics_exact(*, bounds=None):
    """The stored BM25 statistics (document counts, lengths, term frequencies per collection)
    equal a recount from the chunks.

    ``bounds`` also checks the stored score bounds (per collection and term: the highest term
    frequency and the shortest length of the chunks holding it) against the recount:
    ``"hold"``: every chunk is within them (deletes may leave them loose, never wrong);
    ``"terms"``: they hold and name the same terms as the recount; ``"tight"``: they equal it.
    """
    if bounds not in (None, "hold", "terms", "tight"):
        raise ValueError(f"bounds must be None, 'hold', 'terms' or 'tight', not {bounds!r}")
    counts = recount_statistics()
    assert counts["stored"] == counts["recount"]
    if bounds is None:
        return
    stored, recount = counts["bounds"]["stored"], counts["bounds"]["recount"]
    if bounds in ("terms", "tight"):
        assert set(stored) == set(recount)  # the terms some chunk holds, per collection
    if bounds == "tight":
        assert stored == recount
    for key, (tf, length) in recount.items():
        assert stored[key][0] >= tf and stored[key][1] <= length, key


# --- Celery ---------------------------------------------------------------------------------------


class Worker:
    """A real Celery worker process (solo pool) of tests/celery_app.py on ``broker_url``."""

    def __init__(self, broker_url, tmp_path, **env):
        self.env = {
            **os.environ,
            "CELERY_BROKER_URL": broker_url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DJANGO_RAG_TEST_DATABASE": connection.settings_dict["NAME"],
            "DJANGO_RAG_TEST_EMBEDDER": "tests.embedders.SlowFlakyEmbedder",
            **env,
        }
        self.log = tmp_path / "worker.log"
        self.process = None
        self.started = 0

    def start(self):
        self.started += 1
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.celery_app",
                "worker",
                "--pool=solo",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"worker{self.started}@%h",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=self.log.open("a"),
            stderr=subprocess.STDOUT,
        )

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_for(condition, timeout=60, what="condition", log=None):
    """Poll ``condition`` every 0.2 s; on timeout fail with the end of ``log`` (a worker's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    detail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{detail}")


_BOUNDED_PARSE = """
import importlib, json, resource, sys, time
# A fence for the machine running the tests: without the budgets a bomb asks for 10+ GB.
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
from django.conf import settings
settings.configure(DJANGO_RAG=json.loads(sys.argv[4]))
from django_rag.ingestion.parsers import parse_bytes
data = getattr(importlib.import_module(sys.argv[1]), sys.argv[2])()
started = time.process_time()
try:
    parse_bytes(data, filename="hostile" + sys.argv[3])
    outcome, setting = "parsed", None
except BaseException as exc:
    outcome = getattr(exc, "code", type(exc).__name__)
    setting = getattr(exc, "details", {}).get("setting")
print(json.dumps({
    "outcome": outcome,
    "setting": setting,
    "cpu_seconds": time.process_time() - started,
    "peak_mb": next(
        int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")
    ) / 1024,
    "size": len(data),
}))
"""


def parse_in_bounded_child(
    module: str, builder: str, extension: str, settings: dict | None = None
) -> dict:
    """Parse the file ``module.builder()`` makes, as ``hostile<extension>``, in a fresh process
    (address space fenced at 4 GiB) with ``DJANGO_RAG = settings``: its outcome (``"parsed"``
    or the error's code), the budget setting it names, CPU seconds and peak memory."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _BOUNDED_PARSE,
            module,
            builder,
            extension,
            json.dumps(settings or {}),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- a small graph for the dashboard's Graph page (tests/test_dashboard_panels*.py) -------------


def graph_entity(collection, name, type="thing"):
    return Entity.objects.create(
        collection=collection, name=name, normalized_name=name.lower(), type=type
    )


def panel_graph() -> dict:
    """Entities in "a" and "b", relationships of three strengths and types, and communities
    (dirty and clean, levels 0 and 1), for the Graph page's filters and details."""
    rag.ingest("Jane and Acme.", collection="a")
    rag.ingest("Hidden things.", collection="b")
    a, b = Collection.objects.get(name="a"), Collection.objects.get(name="b")
    jane, acme, bob = (
        graph_entity(a, "Jane Doe", "person"),
        graph_entity(a, "Acme <b>Corp</b>"),
        graph_entity(a, "Bob"),
    )
    hidden = graph_entity(b, "Hidden Corp")
    rels = {
        "strong": Relationship.objects.create(
            source=jane, target=acme, type="WORKS_FOR", strength=9, description="Since 2019.",
            metadata={"evidence": "payroll <script>x</script>"},
        ),
        "medium": Relationship.objects.create(source=bob, target=acme, type="ADVISES", strength=5),
        "weak": Relationship.objects.create(source=jane, target=bob, type="KNOWS", strength=2),
        "hidden": Relationship.objects.create(
            source=hidden, target=graph_entity(b, "Other"), type="OWNS", strength=8
        ),
    }  # fmt: skip
    communities = {
        "dirty": Community.objects.create(
            collection=a, level=0, entity_ids=[jane.pk, acme.pk], summary="Jane at Acme.", dirty=True
        ),
        "clean": Community.objects.create(
            collection=a, level=1, entity_ids=[jane.pk, acme.pk, bob.pk], summary="All three.",
            dirty=False,
        ),
        "hidden": Community.objects.create(collection=b, level=0, entity_ids=[hidden.pk]),
    }  # fmt: skip
    return {"jane": jane, "acme": acme, "bob": bob, "hidden": hidden, **{
        f"rel_{k}": v for k, v in rels.items()}, **{f"com_{k}": v for k, v in communities.items()}}  # fmt: skip
