"""The Sync page: indexed models and synced folders, checked and reconciled as jobs."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse

from ... import sync
from ...models import Job
from ..access import dashboard_view, param
from .common import _confirm, _context, _jobs, _polling, _start

SYNC_JOBS = [Job.Kind.SYNC, Job.Kind.SYNC_ROW]


@dashboard_view
def sync_page(request):
    """Indexed models and synced folders: what is indexed, missing, pending, failed, and what
    the last check found stale; Check (a dry run) and Reconcile / Sync as background jobs."""
    allowed = request.rag_collections
    models = [row for row in sync.status() if allowed is None or row["collection"] in allowed]
    folders = _synced_folders(allowed)
    if request.method == "POST":
        return _sync_action(request, models, folders)
    checks = Job.objects.filter(
        kind=Job.Kind.SYNC, status=Job.Status.COMPLETED, params__dry_run=True
    ).order_by("-finished_at")
    for row in models:
        last = checks.filter(params__model=row["model"]).first()
        row["stale"] = _stale(last)
        row["checked_at"] = last.finished_at if last is not None else None
    jobs = _jobs(request, SYNC_JOBS)
    if request.headers.get("HX-Request"):
        return render(
            request,
            "django_rag/dashboard/_jobs.html",
            {
                "jobs": jobs,
                "polling": _polling(jobs),
                "jobs_url": reverse("django_rag_dashboard:sync"),
            },
        )
    return render(
        request,
        "django_rag/dashboard/sync.html",
        _context(
            request,
            models=models,
            folders=folders,
            jobs=jobs,
            polling=_polling(jobs),
            jobs_url=reverse("django_rag_dashboard:sync"),
        ),
    )


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
            },
        )
        slot = "checked" if params.get("dry_run") else "synced"
        if entry[slot] is None:
            entry[slot] = job
    for entry in folders.values():
        checked = entry["checked"]
        newer = (
            checked is not None
            and checked.status == Job.Status.COMPLETED
            and (entry["synced"] is None or checked.created_at > entry["synced"].created_at)
        )
        entry["stale"] = _stale(checked) if newer else None
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
    what = row["model"] if row else folder["folder"]
    if action == "reconcile" and (
        page := _confirm(
            request,
            title=f"Sync {what}?",
            message="New rows or files are indexed, changed ones replace their document "
            "(embedding them again), documents whose row or file is gone are deleted. "
            "Unchanged ones are left alone.",
            button="Sync",
        )
    ):
        return page
    dry_run = action == "check"
    if row is not None:
        scope_to = None if request.rag_collections is None else row["collection"]
        _start(request, "sync", model=row["model"], dry_run=dry_run, collection=scope_to)
    else:
        from ...ingestion.folders import folder_params

        params = folder_params(folder["folder"], folder["collection"], folder["prefix"], dry_run)
        _start(request, "sync", **params)
    return redirect("django_rag_dashboard:sync")
