"""The test project as an ASGI application, for the servers tests/test_asgi.py starts:
``uvicorn tests.asgi:application``. Static files are served (the chat box's script) as the
live server does; with ``DJANGO_RAG_TEST_LEFT_LOG`` set, the path of every request whose client
disconnected before its response ended is appended to that file, so a test knows when the
server has seen its client leave."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_application = ASGIStaticFilesHandler(get_asgi_application())
LEFT_LOG = os.environ.get("DJANGO_RAG_TEST_LEFT_LOG")


async def application(scope, receive, send):
    if not LEFT_LOG or scope["type"] != "http":
        return await django_application(scope, receive, send)
    ended = False

    async def watched_send(message):
        nonlocal ended
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            ended = True
        await send(message)

    async def watched_receive():
        message = await receive()
        if message["type"] == "http.disconnect" and not ended:
            with open(LEFT_LOG, "a") as log:
                log.write(scope["path"] + "\n")
        return message

    await django_application(scope, watched_receive, watched_send)
