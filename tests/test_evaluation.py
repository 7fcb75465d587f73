"""Evaluation: metric arithmetic, test-case generation, runs, answer judging, BEIR import,
rag_eval and agreement with the benchmark harness."""

import json
import math
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import django_rag as rag
from django_rag.evaluation import (
    NoTestCases,
    aggregate,
    case_metrics,
    compare_runs,
    create_test_case,
    generate_test_cases,
    import_beir,
    ndcg,
    run_evaluation,
)
from django_rag.exceptions import FileNotFound, InvalidInput
from django_rag.models import Chunk, Run, TestCase
from django_rag.testing import ScriptedLLM

# --- metric arithmetic ------------------------------------------------------------------------------


def test_metrics_with_one_relevant_chunk_at_rank_three():
    m = case_metrics(["a", "b", "x", "c"], {"x": 1})
    assert [m[f"recall_at_{k}"] for k in (1, 3, 5, 10)] == [0.0, 1.0, 1.0, 1.0]
    assert [m[f"hit_rate_at_{k}"] for k in (1, 3, 5, 10)] == [0.0, 1.0, 1.0, 1.0]
    assert m["precision_at_3"] == pytest.approx(1 / 3)
    assert m["precision_at_10"] == pytest.approx(1 / 10)  # divides by K with 4 retrieved
    assert m["mrr"] == pytest.approx(1 / 3) and m["first_relevant_rank"] == 3
    assert m["ndcg_at_10"] == pytest.approx(1 / math.log2(4))


def test_metrics_with_several_relevant_and_repeats():
    # "x" repeats (two chunks of one document): counted once, so "y" is at rank 3.
    m = case_metrics(["x", "x", "a", "y"], {"x": 1, "y": 1, "z": 1})
    assert m["recall_at_1"] == pytest.approx(1 / 3)
    assert m["recall_at_3"] == pytest.approx(2 / 3)
    assert m["precision_at_3"] == pytest.approx(2 / 3)
    assert m["mrr"] == 1.0
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg_at_10"] == pytest.approx((1 + 1 / math.log2(4)) / ideal)


def test_metrics_when_nothing_relevant_is_retrieved():
    m = case_metrics(["a", "b"], {"x": 2})
    assert all(m[f"recall_at_{k}"] == 0 for k in (1, 3, 5, 10))
    assert m["mrr"] == 0 and m["ndcg_at_10"] == 0 and m["first_relevant_rank"] is None
    assert case_metrics([], {"x": 1})["hit_rate_at_10"] == 0


def test_graded_ndcg_and_ties_in_grades():
    relevant = {"a": 3, "b": 1, "c": 3}
    best = ndcg(["a", "c", "b"], relevant)
    assert best == pytest.approx(1.0)
    assert ndcg(["c", "a", "b"], relevant) == pytest.approx(1.0)  # equal grades: either order
    worse = ndcg(["b", "a", "c"], relevant)
    dcg = 1 + 3 / math.log2(3) + 3 / math.log2(4)
    idcg = 3 + 3 / math.log2(3) + 1 / math.log2(4)
    assert worse == pytest.approx(dcg / idcg) and worse < best
    assert ndcg(["a"], {}) == 0.0


def test_aggregate_means_and_zero_cases():
    cases = [case_metrics(["x"], {"x": 1}), case_metrics(["a", "x"], {"x": 1})]
    summary = aggregate(cases)
    assert summary["mrr"] == pytest.approx(0.75)
    assert summary["hit_rate_at_1"] == 0.5 and summary["test_case_count"] == 2
    empty = aggregate([])
    assert empty["mrr"] == 0.0 and empty["test_case_count"] == 0


# --- test cases -------------------------------------------------------------------------------------

FACTS = {
    "leave": "Employees get 25 days of paid annual leave per year.",
    "remote": "Staff may work remotely up to three days a week.",
    "drill": "The X200 drill has a 1200 watt motor and a two year warranty.",
    "saw": "The circular saw S5 cuts wood up to 65 millimetres deep.",
}


@pytest.fixture
def facts(db):
    return {key: rag.ingest(text, collection="kb", source_id=key) for key, text in FACTS.items()}


QUESTION = "Write one specific question"  # part of the generation prompt


@pytest.mark.django_db
def test_generation_stores_a_case_per_parseable_answer(facts):
    llm = ScriptedLLM(
        '{"question": "How many days of leave do employees get?"}',
        '```json\n{"question": "How far can the S5 cut?"}\n```',
        "I cannot write a question.",
        "",
    )
    result = generate_test_cases(4, collection="kb", llm=llm, seed=7)
    assert len(result.created) == 2 and result.skipped == 2 and len(result.errors) == 2
    for case in result.created:
        assert case.origin == "generated" and case.collection.name == "kb"
        assert [r.chunk_id for r in case.relevance.all()] == [case.source_chunk_id]
        assert (
            case.source_chunk.text
            in llm.calls[
                [c["prompt"] for c in llm.calls].index(
                    next(c["prompt"] for c in llm.calls if case.source_chunk.text in c["prompt"])
                )
            ]["prompt"]
        )


@pytest.mark.django_db
def test_generation_failures_and_seeded_sampling(facts):
    result = generate_test_cases(3, llm=ScriptedLLM(RuntimeError("down"), default='{"q": 1}'))
    assert result.created == [] and result.skipped == 3
    first = ScriptedLLM(default='{"question": "q?"}')
    second = ScriptedLLM(default='{"question": "q?"}')
    generate_test_cases(2, llm=first, seed=3)
    generate_test_cases(2, llm=second, seed=3)
    assert sorted(c["prompt"] for c in first.calls) == sorted(c["prompt"] for c in second.calls)
    with pytest.raises(InvalidInput):
        generate_test_cases(0, llm=first)


@pytest.mark.django_db
def test_manual_test_cases_validate(facts):
    chunk = Chunk.objects.get(document=facts["drill"])
    case = create_test_case(
        "X200 warranty?", chunks=[chunk], reference_answer="Two years.", collection="kb"
    )
    assert case.level == "chunk" and case.relevance.get().chunk_id == chunk.pk
    by_doc = create_test_case("leave?", documents=[facts["leave"]], grades={facts["leave"].pk: 2})
    assert by_doc.level == "document" and by_doc.relevance.get().grade == 2
    with pytest.raises(InvalidInput):
        create_test_case("no targets")
    with pytest.raises(InvalidInput):
        create_test_case("  ", chunks=[chunk])


# --- runs -------------------------------------------------------------------------------------------


def manual_cases(facts):
    for key, question in [
        ("leave", "paid annual leave days"),
        ("saw", "circular saw depth wood"),
        ("drill", "drill motor watt warranty"),
    ]:
        create_test_case(
            question,
            chunks=Chunk.objects.filter(document=facts[key]),
            collection="kb",
            reference_answer=f"about {key}",
        )


@pytest.mark.django_db
def test_run_stores_config_metrics_and_per_case_results(facts):
    manual_cases(facts)
    run = run_evaluation(mode="fulltext", collection="kb", limit=3)
    run.refresh_from_db()
    assert run.status == "completed" and run.finished_at and run.test_case_count == 3
    assert run.metrics["recall_at_1"] == 1.0 and run.metrics["mrr"] == 1.0
    assert run.config["mode"] == "fulltext" and run.config["embedder"] == "hashing-bow"
    assert run.config["dimensions"] == 384 and run.config["limit"] == 3
    first = run.results[0]
    assert first["first_relevant_rank"] == 1 and first["retrieved"][0] in first["expected"]
    assert len(first["retrieved"]) <= 3


@pytest.mark.django_db
def test_a_failing_run_is_stored_as_failed(facts, failing_embedder):
    manual_cases(facts)
    # By default a retriever error counts as an empty result for its case...
    kept = run_evaluation(mode="semantic", embedder=failing_embedder("paid"))
    failed = [r for r in kept.results if r.get("error")]
    assert kept.status == "completed" and kept.metrics["errors"] == 1 == len(failed)
    assert "provider refused" in failed[0]["error"] and failed[0]["retrieved"] == []
    assert failed[0]["recall_at_10"] == 0.0
    kept.delete()
    # ...and with fail_fast the first error fails the run.
    with pytest.raises(RuntimeError, match="provider refused") as info:
        run_evaluation(mode="semantic", embedder=failing_embedder("paid"), fail_fast=True)
    run = Run.objects.get()
    assert run.status == "failed" and "provider refused" in run.error and run.finished_at
    assert f"run {run.pk} was stored as failed" in str(info.value.__notes__)
    with pytest.raises(NoTestCases):
        run_evaluation(collection="nothing-here")


@pytest.mark.django_db
def test_cases_whose_chunks_are_gone_are_skipped(facts):
    manual_cases(facts)
    rag.ingest(
        "Employees now get 28 days of leave.", collection="kb", source_id="leave", replace=True
    )
    run = run_evaluation(mode="fulltext", collection="kb")
    assert run.metrics["skipped"] == 1 and run.metrics["test_case_count"] == 2


@pytest.mark.django_db
def test_answers_are_judged_for_faithfulness_and_correctness(facts):
    manual_cases(facts)
    llm = ScriptedLLM(
        rules={
            "You answer the user's question": "An answer [1].",
            "Rate how faithful": '{"score": 8, "reasoning": "supported"}',
            "same facts as the reference": "no idea",
        }
    )
    run = run_evaluation(mode="fulltext", collection="kb", evaluate_answers=True, llm=llm)
    assert run.metrics["faithfulness"] == 8.0 and "correctness" not in run.metrics
    case = run.results[0]
    assert case["answer"] == "An answer [1]." and case["faithfulness_reasoning"] == "supported"
    assert case["correctness"] is None and case["correctness_reasoning"].startswith("not scored")
    assert run.usage["calls"] == 9 and run.config["llm"] == "scripted"


@pytest.mark.django_db
def test_compare_runs(facts):
    manual_cases(facts)
    a = run_evaluation(mode="fulltext", collection="kb")
    b = run_evaluation(mode="semantic", collection="kb")
    table = compare_runs(a, b.pk)
    assert table["mrr"]["delta"] == pytest.approx(b.metrics["mrr"] - a.metrics["mrr"])
    assert "faithfulness" not in table
    paired = table["paired_ndcg_at_10"]
    assert paired["cases"] == a.test_case_count
    assert paired["delta"] == pytest.approx(b.metrics["ndcg_at_10"] - a.metrics["ndcg_at_10"])
    assert paired["low"] <= paired["delta"] <= paired["high"]


# --- BEIR --------------------------------------------------------------------------------------------

CORPUS = [
    ("d1", "Aspirin", "Aspirin reduces the risk of heart attack in adults with heart disease."),
    ("d2", "Vitamin D", "Vitamin D supplements do not prevent fractures in older adults."),
    ("d3", "Exercise", "Regular exercise lowers blood pressure and improves heart health."),
    ("d4", "Sleep", "Short sleep duration is linked to obesity in children."),
    ("d5", "Coffee", "Coffee consumption is associated with a lower risk of liver disease."),
    ("d6", "Smoking", "Smoking increases the risk of lung cancer and heart disease."),
]
QUERIES = {
    "q1": ("aspirin heart attack risk", {"d1": 2, "d6": 1}),
    "q2": ("vitamin D fractures elderly", {"d2": 1}),
    "q3": ("does coffee protect the liver", {"d5": 1}),
    "q4": ("sleep and childhood obesity", {"d4": 2}),
    "q5": ("query without judged documents in the corpus", {"d99": 1}),
}


def write_beir(path):
    (path / "qrels").mkdir(parents=True)
    with (path / "corpus.jsonl").open("w") as f:
        for doc_id, title, text in CORPUS:
            f.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
    with (path / "queries.jsonl").open("w") as f:
        for qid, (text, _) in QUERIES.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
        f.write(json.dumps({"_id": "q6", "text": "a query with no judgements"}) + "\n")
    with (path / "qrels" / "test.tsv").open("w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, (_, judged) in QUERIES.items():
            for doc_id, grade in judged.items():
                f.write(f"{qid}\t{doc_id}\t{grade}\n")
        f.write("q1\td3\t0\n")  # a zero grade is not relevant
    return path


@pytest.mark.django_db
@pytest.mark.parametrize("headers", [True, False])
def test_beir_import_embeds_and_indexes_each_title_once(tmp_path, settings, headers):
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "CHUNK_HEADERS": headers}
    path = write_beir(tmp_path / "mini")
    with (path / "corpus.jsonl").open("a") as f:
        f.write(json.dumps({"_id": "d7", "title": "Title only", "text": ""}) + "\n")
    import_beir(path, collection="mini")
    for doc_id, title, text in CORPUS:
        chunk = Chunk.objects.get(document__source_id=doc_id)
        assert chunk.document.title == title
        if headers:  # the header carries the title; the stored text is the document's own
            assert (chunk.text, chunk.metadata.get("header")) == (text, title)
        else:
            assert (chunk.text, chunk.metadata.get("header")) == (f"{title}\n\n{text}", None)
    assert Chunk.objects.get(document__source_id="d7").text == "Title only"


@pytest.mark.django_db
def test_beir_import_counts_and_reimport(tmp_path):
    path = write_beir(tmp_path / "mini")
    counts = import_beir(path, collection="mini")
    assert counts == {
        "documents": 6,
        "test_cases": 4,
        "relevance": 5,
        "skipped_queries": 1,
        "existing_test_cases": 0,
    }
    case = TestCase.objects.get(external_id="q1")
    assert case.level == "document" and case.origin == "imported"
    grades = {r.document.source_id: r.grade for r in case.relevance.select_related("document")}
    assert grades == {"d1": 2, "d6": 1}
    again = import_beir(path, collection="mini")
    assert again["test_cases"] == 0 and again["existing_test_cases"] == 4
    assert TestCase.objects.count() == 4 and rag.search("aspirin", collection="mini")
    with pytest.raises(FileNotFound, match="qrels/dev.tsv"):
        import_beir(path, split="dev")


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["fulltext", "semantic", "hybrid"])
def test_rag_eval_run_agrees_with_the_benchmark_harness(tmp_path, mode):
    from benchmarks.beir import load, metrics

    path = write_beir(tmp_path / "mini")
    out = StringIO()
    call_command("rag_eval", "import-beir", str(path), "--collection", "mini", stdout=out)
    assert "Imported 6 documents and 4 test cases" in out.getvalue()
    out = StringIO()
    call_command("rag_eval", "run", "--mode", mode, "--format", "json", stdout=out)
    run = json.loads(out.getvalue())
    # The harness of the search benchmarks on the same data: its own loading, search and metrics.
    _, queries, qrels = load(path, "test")
    per_query = []
    for qid, text in queries.items():
        if not qrels[qid].keys() & {doc_id for doc_id, _, _ in CORPUS}:
            continue
        hits = rag.search(text, collection="mini", limit=100, mode=mode)
        per_query.append(metrics(list(dict.fromkeys(h.source_id for h in hits)), qrels[qid]))
    assert run["metrics"]["test_case_count"] == len(per_query) == 4
    for ours, theirs in [
        ("ndcg_at_10", "nDCG@10"),
        ("mrr", "MRR@10"),
        ("recall_at_10", "Recall@10"),
    ]:
        expected = sum(q[theirs] for q in per_query) / len(per_query)
        assert run["metrics"][ours] == pytest.approx(expected), ours


# --- rag_eval ------------------------------------------------------------------------------------------


def run_command(*args):
    out = StringIO()
    call_command("rag_eval", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_fail_under_exit_codes(facts):
    manual_cases(facts)
    output = run_command("run", "--mode", "fulltext", "--fail-under", "recall_at_5=0.9")
    assert "recall_at_5 1.0000 >= 0.9000: ok" in output
    with pytest.raises(CommandError, match="Below threshold: mrr 1.0000 < 1.5000") as info:
        run_command("run", "--mode", "fulltext", "--fail-under", "mrr=1.5")
    assert info.value.returncode == 1
    with pytest.raises(CommandError):
        run_command("run", "--fail-under", "not_a_metric=1")


@pytest.mark.django_db
def test_rag_eval_generate_list_show_compare(facts):
    with override_settings(
        DJANGO_RAG={
            "EMBEDDER": "hashing",
            "LLM": ScriptedLLM(default='{"question": "What does the X200 drill have?"}'),
        }
    ):
        assert "Generated 2 test cases (0 skipped" in run_command(
            "generate", "--sample-size", "2", "--collection", "kb", "--seed", "1"
        )
    first = run_command("run", "--mode", "fulltext")
    assert first.startswith("Run ") and "recall_at_5" in first and "ndcg_at_10" in first
    run_command("run", "--mode", "semantic")
    ids = list(Run.objects.order_by("id").values_list("pk", flat=True))
    listing = run_command("list")
    assert f"{ids[0]:>5}" in listing and "fulltext" in listing and "semantic" in listing
    assert json.loads(run_command("show", str(ids[0]), "--format", "json"))["mode"] == "fulltext"
    compared = run_command("compare", str(ids[0]), str(ids[1]))
    assert compared.splitlines()[0].split() == [
        "metric",
        "run",
        str(ids[0]),
        "run",
        str(ids[1]),
        "delta",
    ]
    assert "mrr" in compared
    assert "paired nDCG@10 difference over" in compared and "bootstrap interval" in compared
    with pytest.raises(CommandError, match="does not exist"):
        run_command("show", "999999")


@pytest.mark.django_db(transaction=True)
def test_deleting_a_document_keeps_test_cases_consistent():
    """A deleted chunk: its test cases lose their source chunk and chunk relevance, and the
    transaction commits (the foreign keys are checked at commit)."""
    from django_rag.models import Relevance, TestCase

    doc = rag.ingest("Refunds take fourteen days.", collection="ev-del")
    chunk = doc.chunks.get()
    case = TestCase.objects.create(
        question="How long do refunds take?", collection=doc.collection, source_chunk=chunk
    )
    Relevance.objects.create(test_case=case, chunk=chunk)
    rag.delete(doc)
    case.refresh_from_db()
    assert case.source_chunk_id is None and not case.relevance.exists()


def test_qrels_without_a_header_keep_their_first_judgement(tmp_path):
    from django_rag.evaluation.beir import read_qrels

    with_header = tmp_path / "a.tsv"
    with_header.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\n")
    without = tmp_path / "b.tsv"
    without.write_text("q1\td1\t1\nq2\td2\t2\n")
    assert read_qrels(with_header) == read_qrels(without) == {"q1": {"d1": 1}, "q2": {"d2": 2}}


def test_bootstrap_and_paired_difference():
    from django_rag.evaluation import bootstrap_interval, paired_difference

    mean, low, high = bootstrap_interval([0.5] * 10)
    assert mean == low == high == 0.5
    values = [i / 100 for i in range(100)]
    mean, low, high = bootstrap_interval(values)
    assert low < mean < high and mean == pytest.approx(0.495)
    assert bootstrap_interval(values) == (mean, low, high)  # seeded: reproducible
    better = [v + 0.1 for v in values]
    delta, low, high = paired_difference(values, better)
    assert delta == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)
    noisy = [v + (0.05 if i % 2 else -0.05) for i, v in enumerate(values)]
    delta, low, high = paired_difference(values, noisy)
    assert low < 0 < high  # a difference within noise straddles zero
