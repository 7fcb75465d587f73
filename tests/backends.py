"""Helpers for tests that cut a worker process off the database (tests/test_lost_connection.py,
tests/test_celery_worker.py): a status history recorded by triggers (every change of a job's
or a document's status, whichever process made it, however briefly it lasted), and
``pg_terminate_backend`` on the backends of a process started with
``DJANGO_RAG_TEST_APPLICATION_NAME``."""

import time
from contextlib import contextmanager

from django.db import connection

_TABLES = {"job": "django_rag_job", "document": "django_rag_document"}


@contextmanager
def status_history():
    """Record every status change of jobs and documents (with the error and, for jobs, the
    backoff's ``not_before``) in a table, for :func:`history`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE status_log (n bigserial PRIMARY KEY, kind text, row_id bigint, "
            "status text, error text, not_before timestamptz, "
            "at timestamptz DEFAULT clock_timestamp())"
        )
        cursor.execute(
            "CREATE FUNCTION log_status() RETURNS trigger AS $$ BEGIN "
            "IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN "
            "INSERT INTO status_log (kind, row_id, status, error, not_before) VALUES "
            "(TG_ARGV[0], NEW.id, NEW.status, NEW.error, "
            "(to_jsonb(NEW) ->> 'not_before')::timestamptz); END IF; RETURN NEW; END $$ "
            "LANGUAGE plpgsql"
        )
        for kind, table in _TABLES.items():
            cursor.execute(
                f"CREATE TRIGGER log_status AFTER INSERT OR UPDATE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION log_status('{kind}')"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for table in _TABLES.values():
                cursor.execute(f"DROP TRIGGER IF EXISTS log_status ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS log_status()")
            cursor.execute("DROP TABLE IF EXISTS status_log")


def history(kind: str, row_id: int) -> list[dict]:
    """The statuses ``kind`` ("job" or "document") ``row_id`` went through, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status, error, not_before, at FROM status_log "
            "WHERE kind = %s AND row_id = %s ORDER BY n",
            [kind, row_id],
        )
        return [
            {"status": status, "error": error, "not_before": not_before, "at": at}
            for status, error, not_before, at in cursor.fetchall()
        ]


def statuses(kind: str, row_id: int) -> list[str]:
    return [row["status"] for row in history(kind, row_id)]


def backends(application_name: str, *, waiting_on_advisory_lock: bool = False) -> list[int]:
    """Backend pids of the process started with this application name (optionally only the
    one waiting for an advisory lock: a write inside its transaction)."""
    sql = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
    if waiting_on_advisory_lock:
        sql += " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
    with connection.cursor() as cursor:
        cursor.execute(sql, [application_name])
        return [pid for (pid,) in cursor.fetchall()]


def terminate(pids: list[int]) -> None:
    """Terminate these backends and wait until they are gone: termination is asynchronous, and
    a query sent before the backend acts on it would still be answered."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid, 30000) FROM unnest(%s::int[]) AS pid", [pids]
        )
        assert all(ok for (ok,) in cursor.fetchall()), pids


def wait_for(condition, what, timeout=90, log=None):
    """Poll ``condition`` (a safety limit, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    detail = log.read_text()[-4000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{detail}")


@contextmanager
def identity_locked(collection: str, source_id: str):
    """Hold the store's identity lock of (collection, source_id) from the test's connection,
    so a worker writing that identity waits inside its transaction (django_rag.store's
    ``lock_identity``)."""
    from django_rag.store.documents import identity_key

    key = identity_key(collection, source_id, "")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [key])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [key])
