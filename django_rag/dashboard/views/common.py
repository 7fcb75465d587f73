"""What every dashboard page shares: the page context, the confirmation page of a
destructive POST, and the background jobs tables (start, list, decorate, poll)."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Q
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from ... import background
from ...background import start
from ...models import Chunk, Collection, Document, Job
from ...results import VERDICTS
from ..access import scope

#: What the Ask and Info pages say when no LLM can answer.
LLM_HINT = (
    "Set DJANGO_RAG['LLM'] in settings.py to a litellm model such as 'openai/gpt-4o-mini' "
    "(with its API key in the environment, e.g. OPENAI_API_KEY), a callable taking the prompt "
    "and returning text, or an LLM instance; then restart the server."
)


def visible_collections(request):
    return scope(Collection.objects.order_by("name"), request, field="name")


def page_context(request, **extra):
    documents = scope(Document.objects.all(), request)
    chunks = scope(Chunk.objects.all(), request)
    return {
        "stats": {"documents": documents.count(), "chunks": chunks.count()},
        "collections": list(visible_collections(request).values_list("name", flat=True)),
        **extra,
    }


def llm_status() -> dict:
    """Whether ``DJANGO_RAG["LLM"]`` is set and can be built, before anyone asks:
    ``configured``, ``label`` (its class and model, secrets redacted) and ``problem`` (why it
    cannot answer, with what to set; None when it can)."""
    from ...conf import get_setting, scrub_text
    from ...llm import get_llm

    if get_setting("LLM") is None:
        return {"configured": False, "label": None, "problem": "No LLM is configured."}
    try:
        llm = get_llm(feature="The Ask page")
    except Exception as exc:  # a wrong spec or a missing backend: say so on the page
        problem = f"DJANGO_RAG['LLM'] cannot be built: {type(exc).__name__}: {exc}"
        return {"configured": False, "label": None, "problem": scrub_text(problem)[:500]}
    label = scrub_text(f"{type(llm).__name__} {llm.model_name}")
    return {"configured": True, "label": label, "problem": None}


def _cancel_url(request) -> str:
    """Back to the page the form was on (same site only), else the dashboard's home."""
    from django.utils.http import url_has_allowed_host_and_scheme

    referer = request.META.get("HTTP_REFERER", "")
    if referer and url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return referer
    return reverse("django_rag_dashboard:home")


def confirm_page(request, *, title: str, message: str, button: str, details=None):
    """The confirmation page of a destructive POST, or None once it is confirmed.

    The page re-posts the same fields with ``confirmed=yes`` (plain HTML: no JavaScript).
    """
    if request.POST.get("confirmed") == "yes":
        return None
    fields = [
        (name, value)
        for name in request.POST
        if name not in ("csrfmiddlewaretoken", "confirmed")
        for value in request.POST.getlist(name)
    ]
    return render(
        request,
        "django_rag/dashboard/confirm.html",
        page_context(
            request,
            title=title,
            message=message,
            button=button,
            details=details or [],
            fields=fields,
            action=request.get_full_path(),
            cancel=_cancel_url(request),
        ),
    )


def back_to(request, default: str):
    return HttpResponseRedirect(reverse(f"django_rag_dashboard:{default}"))


JOB_LIMIT = 20


def start_job(request, task: str, *, label: str = "", **params):
    """Start a background job; its failure (inline mode) becomes a message, never a 500.
    ``label`` names it in the messages (the task's name by default)."""

    name = label or task.replace("_", " ").capitalize()
    try:
        job = start(task, **params)
    except Exception as exc:
        messages.error(request, f"{name} failed: {exc}")
        return None
    if job.status == job.Status.COMPLETED:
        messages.success(request, f"{name} finished (job {job.pk}).")
    else:
        messages.info(request, f"{name} started as job {job.pk}.")
    return job


def scoped_jobs(request):
    jobs = Job.objects.order_by("-created_at", "-pk")
    if request.rag_collections is not None:
        # A restricted user sees the jobs of their collections only.
        allowed = list(request.rag_collections)
        jobs = jobs.filter(
            Q(params__collection__in=allowed) | Q(params__options__collection__in=allowed)
        )
    return jobs


def jobs_of_kinds(request, kinds):
    return decorate_jobs(list(scoped_jobs(request).filter(kind__in=kinds)[:JOB_LIMIT]))


def decorate_jobs(jobs):
    """What the jobs table shows beyond the row: stalled, retryable, the result as rows."""
    after = background.describe().get("stalled_after_seconds") or 0
    for job in jobs:
        job.stalled = bool(after) and background.is_stalled(job, stalled_after=after)
        job.heartbeat_age = (
            int((timezone.now() - job.heartbeat_at).total_seconds())
            if job.status == Job.Status.RUNNING and job.heartbeat_at
            else None
        )
        job.retryable = background.retryable(job, stalled_after=after)
        # Why a failed job offers no Retry (a superseded one says why in its own message).
        job.no_retry = (
            background.why_not_retryable(job)
            if job.status == Job.Status.FAILED and not job.retryable
            else ""
        )
        job.kind_label = job.get_kind_display()
        job.status_label = job.get_status_display()
        job.result_rows = _result_rows(job.result)
        if job.kind == Job.Kind.SYNC:
            _label_sync(job)
        job.duration_text = _duration(job.duration)
    return jobs


#: How a dry run's counts read: what a sync *would* do, never what it did.
WOULD = {
    "added": "would add",
    "replaced": "would replace",
    "updated": "would update",
    "deleted": "would delete",
}


def sync_name(params: dict) -> str:
    """What a ``sync`` job is, from its params: a check (dry run) or a sync of a folder, or a
    check or reconcile of one model or of every indexed model."""
    dry_run = bool(params.get("dry_run"))
    if params.get("folder"):
        return "Check folder" if dry_run else "Sync folder"
    verb = "Check" if dry_run else "Reconcile"
    if params.get("model"):
        return f"{verb} model {params['model']}"
    return f"{verb} all indexed models"


def sync_summary(result, *, dry_run: bool) -> str:
    """A sync's counts in words: ``would add 2, would delete 1`` for a dry run, ``added 2,
    deleted 1`` for a sync; zero counts are left out (``nothing to change`` / ``no change``)."""
    result = result if isinstance(result, dict) else {}
    parts = []
    for key in ("added", "replaced", "updated", "deleted"):
        count = result.get(key) or 0
        if count:
            parts.append(f"{WOULD[key] if dry_run else key} {count}")
    if not parts:
        parts.append("nothing to change" if dry_run else "no change")
    for key in ("unchanged", "failed"):
        if result.get(key):
            parts.append(f"{result[key]} {key}")
    return ", ".join(parts)


def _label_sync(job) -> None:
    """A ``sync`` job named for what it is; a dry run's status and counts read as a check."""
    dry_run = bool(job.params.get("dry_run"))
    job.kind_label = sync_name(job.params)
    if not dry_run:
        return
    if job.status == Job.Status.COMPLETED:
        job.status_label = "Checked"
        job.summary = f"Checked: {sync_summary(job.result, dry_run=True)}"
    elif job.status in (Job.Status.PENDING, Job.Status.RUNNING):
        job.status_label = f"{job.get_status_display()} (check)"
    for row in job.result_rows:
        row["label"] = WOULD.get(row["label"], row["label"])


def _duration(delta) -> str:
    if delta is None:
        return ""
    seconds = delta.total_seconds()
    if seconds < 0.1:
        # A quick run (a folder synced from the command line) reads in ms, never "0.0 s".
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.0005 else "under 1 ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _value(value) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "—"}[value]
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')}: {_value(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_value(v) for v in value[:20]) + (" …" if len(value) > 20 else "")
    return str(value)


def _result_rows(result) -> list[dict]:
    """A job's result as (label, value, link) rows: one per key, nested dicts flattened a
    level, a document id linked to its page."""
    if not isinstance(result, dict):
        return [{"label": "result", "value": _value(result), "url": ""}] if result else []
    rows = []
    for key, value in result.items():
        if isinstance(value, dict) and all(not isinstance(v, dict) for v in value.values()):
            for inner, v in value.items():
                rows.append(
                    {"label": f"{key} · {inner}".replace("_", " "), "value": _value(v), "url": ""}
                )
            continue
        url = ""
        if key == "document_id" and isinstance(value, int):
            url = reverse("django_rag_dashboard:document", args=[value])
        rows.append({"label": key.replace("_", " "), "value": _value(value), "url": url})
    return rows


def polling(jobs) -> bool:
    return any(job.status in ("pending", "running") for job in jobs)


def _field(item, name: str):
    """A grounding's or a span's field, from the object (``Answer.grounding``) or from its
    stored dict (``Grounding.to_dict()`` in a run's results)."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def grounded_segments(text: str, grounding) -> list[dict]:
    """The answer cut into pieces for display, each marked with the verdict of the grounded
    span covering it (None between spans), for the Ask page and an evaluation run alike.

    The grounding and its spans are objects or their stored dicts (``start``, ``end``,
    ``verdict``, ``chunk_ids``, ``score``). Out-of-range spans are clipped to the text,
    overlapping ones to what the earlier spans leave; a verdict outside ``VERDICTS`` shows as
    unsupported. Without a usable span: the whole text as one plain piece.
    """
    text = text if isinstance(text, str) else ""
    items = _field(grounding, "spans") if grounding is not None else None
    spans = []
    for item in items if isinstance(items, list | tuple) else []:
        try:
            start, end = int(_field(item, "start")), int(_field(item, "end"))
        except (TypeError, ValueError):
            continue
        start, end = max(0, start), min(len(text), end)
        if end > start:
            spans.append((start, end, item))
    spans.sort(key=lambda entry: entry[0])
    segments, at = [], 0
    for start, end, item in spans:
        start = max(start, at)
        if end <= start:
            continue
        if start > at:
            segments.append({"text": text[at:start], "verdict": None})
        verdict = _field(item, "verdict")
        chunk_ids = _field(item, "chunk_ids")
        segments.append(
            {
                "text": text[start:end],
                "verdict": verdict if verdict in VERDICTS else "unsupported",
                "chunk_ids": list(chunk_ids) if isinstance(chunk_ids, list | tuple) else [],
                "score": _field(item, "score"),
            }
        )
        at = end
    if at < len(text):
        segments.append({"text": text[at:], "verdict": None})
    return segments
