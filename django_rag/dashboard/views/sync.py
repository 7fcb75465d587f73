"""The Sync page: indexed models and synced folders, checked and reconciled as jobs."""

from __future__ import annotations

from django.contrib import messages
from django.db.models import Q
from django.shortcuts import redirect, render
from django.urls import reverse

from ... import sync
from ...models import Job
from ..access import dashboard_view, param
from .common import (
    confirm_page,
    jobs_of_kinds,
    page_context,
    polling,
    start_job,
    sync_name,
    sync_summary,
)

SYNC_JOBS = [Job.Kind.SYNC, Job.Kind.SYNC_ROW]


@dashboard_view
def sync_page(request):
    """Indexed models and synced folders: what is indexed, missing, pending, failed, and what
    the last check found stale; Check (a dry run) and Reconcile / Sync as background jobs."""
    allowed = request.rag_collections
    models = [row for row in sync.status() if allowed is None or row["collection"] in allowed]
    folders = _synced_folders(allowed)
    for row in models:
        _model_state(row)
    if request.method == "POST":
        return _sync_action(request, models, folders)
    jobs = jobs_of_kinds(request, SYNC_JOBS)
    if request.headers.get("HX-Request"):
        return render(
            request,
            "django_rag/dashboard/_jobs.html",
            {
                "jobs": jobs,
                "polling": polling(jobs),
                "jobs_url": reverse("django_rag_dashboard:sync"),
            },
        )
    return render(
        request,
        "django_rag/dashboard/sync.html",
        page_context(
            request,
            models=models,
            folders=folders,
            jobs=jobs,
            polling=polling(jobs),
            jobs_url=reverse("django_rag_dashboard:sync"),
        ),
    )


def _model_state(row: dict) -> None:
    """What the last check of a model found (``stale``, ``check``), unless a successful
    reconcile of that model (or of every model) started after it: then nothing is stale
    (``repaired``)."""
    done = Job.objects.filter(kind=Job.Kind.SYNC, status=Job.Status.COMPLETED).exclude(
        params__has_key="folder"
    )
    check = (
        done.filter(params__dry_run=True, params__model=row["model"])
        .order_by("-created_at", "-pk")
        .first()
    )
    repair = (
        done.exclude(params__dry_run=True)
        .filter(Q(params__model=row["model"]) | Q(params__model=None) | ~Q(params__has_key="model"))
        .order_by("-created_at", "-pk")
        .first()
    )
    _settle(row, check, repair)


def _settle(row: dict, check, repair) -> None:
    """``stale``: the check's count while it is the newest word, 0 once a successful repair
    started after it, None (not checked) when there is neither."""
    row["check"], row["repaired"] = check, None
    if repair is not None and (check is None or _after(repair, check)):
        row["check"], row["repaired"], row["stale"] = None, repair, 0
    else:
        row["stale"] = _stale(check)
    row["checked_at"] = check.finished_at if row["check"] is not None else None
    row["summary"] = sync_summary(check.result, dry_run=True) if row["check"] else ""


def _after(job, other) -> bool:
    return (job.created_at, job.pk) > (other.created_at, other.pk)


def _stale(check) -> int | None:
    """What a completed dry run found out of step (None: never checked)."""
    if check is None:
        return None
    return sum(check.result.get(key, 0) for key in ("added", "replaced", "updated", "deleted"))


def _synced_folders(allowed) -> list[dict]:
    """Each folder synced before (by rag_ingest --sync, sync_folder or a job): its last sync
    and its last check, newest first."""
    runs = Job.objects.filter(kind=Job.Kind.SYNC, params__has_key="folder").order_by(
        "-created_at", "-pk"
    )
    folders: dict[tuple, dict] = {}
    for job in runs[:500]:
        params = job.params
        if allowed is not None and params.get("collection") not in allowed:
            continue
        key = (params["folder"], params.get("collection"), params.get("prefix", ""))
        entry = folders.setdefault(
            key,
            {
                "id": len(folders),
                "folder": key[0],
                "collection": key[1],
                "prefix": key[2],
                "synced": None,
                "checked": None,
                "ok": None,
            },
        )
        completed = job.status == Job.Status.COMPLETED
        if params.get("dry_run"):
            if entry["checked"] is None and completed:
                entry["checked"] = job
        else:
            if entry["synced"] is None:
                entry["synced"] = job
            if entry["ok"] is None and completed:
                entry["ok"] = job
    for entry in folders.values():
        _settle(entry, entry["checked"], entry["ok"])
        if entry["synced"] is not None:
            entry["synced_summary"] = sync_summary(entry["synced"].result, dry_run=False)
    return list(folders.values())


def _sync_action(request, models, folders):
    action = request.POST.get("action", "")
    model = param(request, "model", method="POST", max_length=255)
    folder_id = param(request, "folder", method="POST", max_length=20)
    folder = next((f for f in folders if str(f["id"]) == folder_id), None) if folder_id else None
    row = next((m for m in models if m["model"] == model), None) if model else None
    if action not in ("check", "reconcile") or (row is None) == (folder is None):
        messages.error(request, "Unknown or forbidden action.")
        return redirect("django_rag_dashboard:sync")
    dry_run = action == "check"
    if row is not None:
        scope_to = None if request.rag_collections is None else row["collection"]
        params = {"model": row["model"], "dry_run": dry_run, "collection": scope_to}
    else:
        from ...ingestion.folders import folder_params

        params = folder_params(folder["folder"], folder["collection"], folder["prefix"], dry_run)
    if action == "reconcile" and (page := _confirm_sync(request, row or folder, params)):
        return page
    start_job(request, "sync", label=sync_name(params), **params)
    return redirect("django_rag_dashboard:sync")


def _confirm_sync(request, entry: dict, params: dict):
    """The confirmation of a Reconcile / Sync: what will change, from the last check when it
    is still the newest word, or a hint to check first."""
    is_model = "model" in params
    button = "Reconcile" if is_model else "Sync"
    what = params["model"] if is_model else f"folder {params['folder']}"
    if entry.get("check") is not None:
        when = entry["check"].finished_at
        stamp = when.strftime("%Y-%m-%d %H:%M") if when else "?"
        message = f"The last check ({stamp}) found: {entry['summary']}."
        if entry["stale"]:
            message += " Anything changed since is picked up too."
        else:
            message += " Nothing was out of step then; anything changed since is picked up."
    elif entry.get("repaired") is not None:
        message = (
            "Nothing was out of step after the last successful "
            f"{button.lower()}, and no check ran since: Check first to see what will change."
        )
    else:
        message = "Not checked yet: Check first to see what will change."
    details = [
        "New rows or files are indexed; changed ones replace their document (embedding them "
        "again); documents whose row or file is gone are deleted; unchanged ones are left alone."
    ]
    return confirm_page(
        request, title=f"{button} {what}?", message=message, button=button, details=details
    )
