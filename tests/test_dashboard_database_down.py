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

    from django_rag.dashboard.access import _connecting

    try:
        raise OperationalError("canceling statement due to statement timeout")
    except OperationalError as exc:
        assert _connecting(exc) is None
