"""The Graph page: entities, relationships and communities, and one entity's neighbours."""

from __future__ import annotations

from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, render

from ...models import Community, Entity, EntityMention, Relationship
from ..access import check_collection, dashboard_view, object_id, param, scope
from .common import page_context

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


#: The strength bands of the Relationships tab's filter (extractors grade strength 1 to 10).
STRENGTHS = {
    "strong": ("Strong (7 and up)", Q(strength__gte=7)),
    "medium": ("Medium (4 to under 7)", Q(strength__gte=4, strength__lt=7)),
    "weak": ("Weak (under 4)", Q(strength__lt=4)),
}
#: The Communities tab's status filter: dirty (to summarise again) or clean.
STATUSES = {"dirty": "Dirty (to summarise)", "clean": "Clean"}
#: Members and relationships listed in a community's detail.
COMMUNITY_MEMBERS = 100


def _level(request) -> int | None:
    value = param(request, "level")
    return int(value) if value.isdigit() and len(value) < 6 else None


def _relationship_detail(request, relationships):
    rel = get_object_or_404(relationships, pk=object_id(request.GET["relationship"]))
    return {"relationship": rel, "metadata": sorted(rel.metadata.items())[:50]}


def _community_detail(request, communities, entities, relationships):
    community = get_object_or_404(communities, pk=object_id(request.GET["community"]))
    ids = community.entity_ids[:COMMUNITY_MEMBERS]
    members = entities.filter(pk__in=ids, collection_id=community.collection_id).order_by("name")
    among = relationships.filter(source_id__in=ids, target_id__in=ids)
    return {
        "community": community,
        "members": list(members),
        "more_members": max(0, len(community.entity_ids) - len(ids)),
        "relationships": list(among.order_by("-strength", "pk")[:COMMUNITY_MEMBERS]),
    }


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
    relationship_type = param(request, "rtype") if tab == "relationships" else ""
    strength = param(request, "strength") if tab == "relationships" else ""
    strength = strength if strength in STRENGTHS else ""
    level = _level(request) if tab == "communities" else None
    status = param(request, "status") if tab == "communities" else ""
    status = status if status in STATUSES else ""
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
        if relationship_type:
            rows = rows.filter(type=relationship_type)
        if strength:
            rows = rows.filter(STRENGTHS[strength][1])
        rows = rows.order_by("-strength", "pk")
    else:
        rows = communities
        if q:
            rows = rows.filter(summary__icontains=q)
        if level is not None:
            rows = rows.filter(level=level)
        if status:
            rows = rows.filter(dirty=status == "dirty")
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
    relationship_detail = community_detail = None
    if request.GET.get("relationship"):
        relationship_detail = _relationship_detail(request, relationships)
    if request.GET.get("community"):
        community_detail = _community_detail(request, communities, entities, relationships)
    types = _frequent(entities, 20, entity_type)
    relationship_types = _frequent(relationships, 100, relationship_type)
    levels = sorted(set(communities.values_list("level", flat=True).distinct()))
    # Every link of the page (pages, entities) carries the filters, so none is forgotten.
    kept = {
        "collection": collection,
        "q": q,
        "type": entity_type,
        "rtype": relationship_type,
        "strength": strength,
        "level": "" if level is None else str(level),
        "status": status,
    }
    kept = {k: v for k, v in kept.items() if v}
    filters = urlencode({"tab": tab, **kept})
    shared = {k: v for k, v in kept.items() if k in ("collection", "q")}
    entity_filters = urlencode(
        {"tab": "entities", **shared, **({"type": entity_type} if entity_type else {})}
    )
    return render(
        request,
        "django_rag/dashboard/graph.html",
        page_context(
            request,
            tab=tab,
            page=page,
            detail=detail,
            relationship_detail=relationship_detail,
            community_detail=community_detail,
            q=q,
            selected=collection,
            types=types,
            entity_type=entity_type,
            relationship_types=relationship_types,
            relationship_type=relationship_type,
            strengths=[(key, label) for key, (label, _) in STRENGTHS.items()],
            strength=strength,
            levels=levels,
            level=level,
            statuses=list(STATUSES.items()),
            status=status,
            filters=filters,
            entity_filters=entity_filters,
            graph_stats={
                "entities": entities.count(),
                "relationships": relationships.count(),
                "communities": communities.count(),
            },
        ),
    )


def _frequent(rows, limit: int, chosen: str) -> list[str]:
    """The ``type`` values of ``rows``, most frequent first (``limit`` of them), plus the one
    the filter uses, so its select keeps showing it."""
    found = list(
        rows.values("type").annotate(n=Count("pk")).order_by("-n", "type")
        .values_list("type", flat=True)[:limit]
    )  # fmt: skip
    if chosen and chosen not in found:
        found.append(chosen)
    return found
