"""The dashboard: include ``django_rag.dashboard.urls`` under any prefix.

    path("rag/", include("django_rag.dashboard.urls"))

Staff only by default (``DASHBOARD["PERMISSION"]``); ``DASHBOARD["COLLECTIONS"]`` limits
each user to some collections on every page and action.
"""
