"""The signals that keep a registered model's rows indexed.

Saves, deletes, declared many-to-many changes and declared related rows schedule the row's
sync when the transaction commits (``transaction.on_commit``): nothing is indexed from a
transaction that rolls back, and the job reads the row as committed. What signals cannot see
(``QuerySet.update()``, ``bulk_create``, raw SQL, other programs) is repaired by ``rag_sync``.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

from .registry import IndexedModel


def _uid(spec: IndexedModel, what: str) -> str:
    return f"django_rag.sync:{spec.label}:{what}"


def connect(spec: IndexedModel) -> None:
    from .service import schedule

    def saved(sender, instance, raw=False, using=None, **kwargs):
        if not raw:  # fixtures: rag_sync indexes loaded data
            schedule(spec, [instance.pk], using=using)

    def deleted(sender, instance, using=None, **kwargs):
        # The row is gone when the job runs: name its collection now.
        schedule(spec, [instance.pk], using=using, collections=_collections(spec, instance))

    def m2m(sender, instance, action, reverse, pk_set, using=None, **kwargs):
        if action not in ("post_add", "post_remove", "post_clear"):
            return
        if not reverse:
            schedule(spec, [instance.pk], using=using)
        elif pk_set:  # the other side changed: these rows of ours gained or lost it
            schedule(spec, sorted(pk_set), using=using)

    post_save.connect(saved, sender=spec.model, weak=False, dispatch_uid=_uid(spec, "save"))
    post_delete.connect(deleted, sender=spec.model, weak=False, dispatch_uid=_uid(spec, "delete"))
    for name in spec.m2m:
        through = spec.model._meta.get_field(name).remote_field.through
        m2m_changed.connect(m2m, sender=through, weak=False, dispatch_uid=_uid(spec, f"m2m:{name}"))
    for other, rows_of in spec.related.items():
        model = apps.get_model(other) if isinstance(other, str) else other

        def related_saved(sender, instance, raw=False, using=None, _rows_of=rows_of, **kwargs):
            if not raw:
                schedule(spec, [row.pk for row in _rows_of(instance)], using=using)

        def related_deleting(sender, instance, using=None, _rows_of=rows_of, **kwargs):
            # Before the delete: afterwards the relation (SET_NULL, say) no longer finds them.
            schedule(spec, [row.pk for row in _rows_of(instance)], using=using)

        label = model._meta.label_lower
        post_save.connect(
            related_saved, sender=model, weak=False, dispatch_uid=_uid(spec, f"rel-save:{label}")
        )
        pre_delete.connect(
            related_deleting,
            sender=model,
            weak=False,
            dispatch_uid=_uid(spec, f"rel-delete:{label}"),
        )


def disconnect(spec: IndexedModel) -> None:
    post_save.disconnect(sender=spec.model, dispatch_uid=_uid(spec, "save"))
    post_delete.disconnect(sender=spec.model, dispatch_uid=_uid(spec, "delete"))
    for name in spec.m2m:
        through = spec.model._meta.get_field(name).remote_field.through
        m2m_changed.disconnect(sender=through, dispatch_uid=_uid(spec, f"m2m:{name}"))
    for other in spec.related:
        model = apps.get_model(other) if isinstance(other, str) else other
        label = model._meta.label_lower
        post_save.disconnect(sender=model, dispatch_uid=_uid(spec, f"rel-save:{label}"))
        pre_delete.disconnect(sender=model, dispatch_uid=_uid(spec, f"rel-delete:{label}"))


def _collections(spec: IndexedModel, instance: Any) -> list[str]:
    try:
        return [spec.collection_for(instance)]
    except Exception:  # a per-row collection that needs a related row already deleted
        return []
