"""A dashboard request while the database is down: a 503 page that says the database cannot be
reached and, for the embedded server, the command that starts it. The connection fails for
real: psycopg connects to a local port nothing listens on."""

import socket
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from django_rag.embedded import server as embedded_server
from tests.helpers import url


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def database_down(client, django_db_blocker, monkeypatch):
    """The default database refuses connections; the client has a session cookie, so even
    reading ``request.user`` needs the database."""
    port = closed_port()
    params = connection.get_connection_params
    with django_db_blocker.unblock():
        connection.close()
        monkeypatch.setattr(
            connection,
            "get_connection_params",
            lambda: {**params(), "host": "127.0.0.1", "port": port},
        )
        client.cookies["sessionid"] = "a" * 32
        yield client
        monkeypatch.undo()
        connection.close()


@pytest.fixture
def embedded_database(monkeypatch):
    """The default database is one embedded_database() started (whatever the suite runs on)."""
    key = (connection.settings_dict["HOST"], str(connection.settings_dict["PORT"]))
    monkeypatch.setattr(embedded_server, "_STARTED", {key: Path("/srv/project/.pgdata")})


@pytest.fixture
def external_database(monkeypatch):
    monkeypatch.setattr(embedded_server, "_STARTED", {})


def test_an_embedded_database_that_is_down_gets_a_503_with_the_start_command(
    embedded_database, database_down
):
    response = database_down.get(url("documents"))
    body = response.content.decode()
    assert response.status_code == 503
    assert "The database cannot be reached" in body
    assert "python manage.py check" in body and "django_rag.embedded" in body
    assert "/srv/project/.pgdata" not in body  # paths and errors only with DEBUG
    assert "127.0.0.1" not in body


def test_with_debug_the_page_shows_the_data_directory_and_the_error(
    embedded_database, database_down
):
    with override_settings(DEBUG=True):
        body = database_down.get(url("info")).content.decode()
    assert "/srv/project/.pgdata" in body
    assert "127.0.0.1" in body  # psycopg's own message: connection refused on that port


def test_another_database_that_is_down_gets_a_503_naming_the_setting(
    external_database, database_down
):
    response = database_down.get(url("ask"))
    body = response.content.decode()
    assert response.status_code == 503
    assert "The database cannot be reached" in body
    assert "HOST" in body and "python manage.py check" not in body


def test_an_error_after_connecting_is_not_taken_for_a_database_that_is_down():
    from django.db import OperationalError

    from django_rag.dashboard.access import connecting_wrapper

    try:
        raise OperationalError("canceling statement due to statement timeout")
    except OperationalError as exc:
        assert connecting_wrapper(exc) is None


# --- the rest of the site, with a real embedded server stopped --------------------------------

MIDDLEWARE = "django_rag.dashboard.middleware.EmbeddedDatabaseMiddleware"


def host_page(request):
    """A host project's own page that reads the database."""
    from django.contrib.auth.models import User
    from django.http import HttpResponse

    return HttpResponse(f"{User.objects.count()} users")


urlpatterns = None  # set by the fixture below (this module is the URLconf of its tests)


@pytest.fixture(scope="module")
def stopped_server():
    """The settings of a real embedded server, started in a throwaway data directory and then
    stopped (pg_ctl): nothing listens on its socket any more."""
    import shutil
    import tempfile

    from django_rag import embedded

    root = Path(tempfile.mkdtemp(prefix="rag_down_"))
    try:
        settings = embedded.embedded_database(root / "pgdata")
        assert embedded.stop_data_directory(root / "pgdata")
        yield settings
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def site_down(stopped_server, client, django_db_blocker, monkeypatch):
    """The default database is the stopped embedded server; the client has a session cookie."""
    from django.contrib import admin
    from django.db import connections
    from django.urls import path

    global urlpatterns
    urlpatterns = [path("admin/", admin.site.urls), path("host/", host_page)]
    wrapper = connections["default"]  # the wrapper itself: monkeypatch cannot undo on a proxy
    dead = {
        **wrapper.settings_dict,
        **{key: stopped_server[key] for key in ("HOST", "PORT", "NAME", "USER", "PASSWORD")},
    }
    with django_db_blocker.unblock():
        connection.close()
        monkeypatch.setattr(wrapper, "settings_dict", dead)
        client.cookies["sessionid"] = "a" * 32
        try:
            yield client
        finally:
            monkeypatch.undo()
            connection.close()


def test_with_the_middleware_the_admin_and_host_pages_explain_the_stopped_server(
    site_down, settings
):
    settings.ROOT_URLCONF = __name__
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    for path in ("/admin/login/", "/admin/", "/host/"):
        response = site_down.get(path)
        body = response.content.decode()
        assert response.status_code == 503, (path, body[:300])
        assert "The database cannot be reached" in body and "python manage.py check" in body
        assert response["Retry-After"] == "30"


def test_without_the_middleware_it_is_django_s_own_error(site_down, settings):
    """What the middleware changes: without it the same request raises OperationalError."""
    from django.db import OperationalError

    settings.ROOT_URLCONF = __name__
    with pytest.raises(OperationalError):
        site_down.get("/host/")


def test_another_database_down_is_left_to_django(site_down, settings, monkeypatch):
    """A server embedded_database() did not start (production): the error goes on to Django's
    own handling and error reporting, not a 503 page that would hide it."""
    from django.db import OperationalError

    monkeypatch.setattr(embedded_server, "_STARTED", {})
    settings.ROOT_URLCONF = __name__
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]
    with pytest.raises(OperationalError):
        site_down.get("/host/")


def test_an_error_after_connecting_passes_through_the_middleware(rf):
    from django.db import OperationalError

    from django_rag.dashboard.middleware import EmbeddedDatabaseMiddleware

    middleware = EmbeddedDatabaseMiddleware(lambda request: None)
    try:
        raise OperationalError("canceling statement due to statement timeout")
    except OperationalError as exc:
        assert middleware.process_exception(rf.get("/"), exc) is None
