"""The dashboard's "database cannot be reached" page for the whole site, while the embedded
server is down.

The dashboard's own views already answer a database that cannot be reached with a 503 page
(:func:`django_rag.dashboard.access.dashboard_view`). A project on the embedded server
(``django_rag.embedded``) that adds this middleware gets the same page everywhere else: the
admin's login, its own views::

    MIDDLEWARE = [..., "django_rag.dashboard.middleware.EmbeddedDatabaseMiddleware"]

Only a failure to *connect* to a database that ``embedded_database()`` started is answered so.
Any other error, and any error of another database (a production server), goes on to Django's
own handling (the debug page, ``handler500``, error reporting): there a 503 would hide an
outage from whoever is paged for it.
"""

from __future__ import annotations

from django.db import OperationalError

from ..embedded import embedded_data_directory
from .access import connecting_wrapper, database_unreachable


class EmbeddedDatabaseMiddleware:
    """Answers a view that could not connect to the embedded server with the 503 page that
    says how to start it (anywhere in ``MIDDLEWARE``: it acts on the view's exception)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, OperationalError):
            return None
        wrapper = connecting_wrapper(exception)
        if wrapper is None or embedded_data_directory(wrapper.settings_dict) is None:
            return None
        return database_unreachable(wrapper, exception)
