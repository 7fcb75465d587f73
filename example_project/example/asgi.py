"""The example project under an ASGI server: ``uvicorn example.asgi:application`` (run from
example_project/). Answers and the chat box stream as under WSGI (docs/api.md)."""

import os

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")
application = get_asgi_application()
if settings.DEBUG:  # static files (the chat box's script), as runserver serves them in DEBUG
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    application = ASGIStaticFilesHandler(application)
