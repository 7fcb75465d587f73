"""The Graph page: entities, relationships and communities, and one entity's neighbours."""

from __future__ import annotations

from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, render

from ...models import Community, Entity, EntityMention, Relationship
from ..access import check_collection, dashboard_view, object_id, param, scope
from .common import _context

GRAPH_NEIGHBOURS = 16


def _neighbourhood(entity, edges) -> list[dict]:
    """Positions of an entity's neighbours in a 600 x 300 diagram with the entity at the centre:
    half on a right arc, half on a left arc (never above or below it, where horizontal labels
    would collide), each label written outwards from its node."""
    import math

    right = edges[: (len(edges) + 1) // 2]
    left = edges[len(right) :]
    placed = []
    for side, group in ((1, right), (-1, left)):
        for i, edge in enumerate(group):
            # Spread from -65 to +65 degrees around the horizontal, top to bottom.
            angle = math.radians(-65 + 130 * (i + 0.5) / len(group))
            x = 300 + side * 120 * math.cos(angle)
            y = 150 + 125 * math.sin(angle)
            other = edge.target if edge.source_id == entity.pk else edge.source
            placed.append(
                {
                    "entity": other,
                    "type": edge.type,
                    "outgoing": edge.source_id == entity.pk,
                    "x": round(x, 1),
                    "y": round(y, 1),
                    "label_x": round(x + side * 9, 1),
                    "label_y": round(y + 4, 1),
                    "anchor": "start" if side == 1 else "end",
                }
            )
    return placed


@dashboard_view
def graph(request):
    tab = (
        request.GET.get("tab")
        if request.GET.get("tab") in ("relationships", "communities")
        else "entities"
    )
    q = param(request, "q").strip()
    entities = scope(Entity.objects.select_related("collection"), request)
    relationships = scope(
        Relationship.objects.select_related("source", "target"),
        request,
        field="source__collection__name",
    )
    communities = scope(Community.objects.select_related("collection"), request)
    collection = param(request, "collection")
    entity_type = param(request, "type") if tab == "entities" else ""
    if collection:
        check_collection(request, collection)
        entities = entities.filter(collection__name=collection)
        relationships = relationships.filter(source__collection__name=collection)
        communities = communities.filter(collection__name=collection)
    if tab == "entities":
        rows = entities.annotate(mention_count=Count("mentions", distinct=True))
        if q:
            rows = rows.filter(name__icontains=q)
        if entity_type:
            rows = rows.filter(type=entity_type)
        rows = rows.order_by("-mention_count", "name")
    elif tab == "relationships":
        rows = relationships
        if q:
            rows = rows.filter(
                Q(source__name__icontains=q) | Q(target__name__icontains=q) | Q(type__icontains=q)
            )
        rows = rows.order_by("-strength", "pk")
    else:
        rows = communities
        if q:
            rows = rows.filter(summary__icontains=q)
        rows = rows.order_by("level", "pk")
    page = Paginator(rows, 50).get_page(request.GET.get("page"))
    detail = None
    if request.GET.get("entity"):
        entity = get_object_or_404(entities, pk=object_id(request.GET["entity"]))
        around = relationships.filter(Q(source=entity) | Q(target=entity))
        edges = list(around.order_by("-strength", "pk")[:GRAPH_NEIGHBOURS])
        mentions = EntityMention.objects.filter(entity=entity).select_related("chunk")[:5]
        detail = {
            "entity": entity,
            "neighbours": _neighbourhood(entity, edges),
            "more": around.count() - len(edges),
            "mentions": mentions,
        }
    types = list(
        entities.values("type")
        .annotate(n=Count("pk"))
        .order_by("-n")
        .values_list("type", flat=True)[:20]
    )
    if entity_type and entity_type not in types:
        types.append(entity_type)  # the select keeps showing the filter in use
    # Every link of the page (pages, entities) carries the filters, so none is forgotten.
    kept = {"collection": collection, "q": q, "type": entity_type}
    filters = urlencode({"tab": tab, **{k: v for k, v in kept.items() if v}})
    entity_filters = urlencode({"tab": "entities", **{k: v for k, v in kept.items() if v}})
    return render(
        request,
        "django_rag/dashboard/graph.html",
        _context(
            request,
            tab=tab,
            page=page,
            detail=detail,
            q=q,
            selected=collection,
            types=types,
            entity_type=entity_type,
            filters=filters,
            entity_filters=entity_filters,
            graph_stats={
                "entities": entities.count(),
                "relationships": relationships.count(),
                "communities": communities.count(),
            },
        ),
    )
