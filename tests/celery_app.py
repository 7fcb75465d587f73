"""The Celery app of the worker tests (``celery -A tests.celery_app worker``)."""

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

app = Celery("django_rag_tests")
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL"),
    # A killed worker's unacknowledged task comes back after this many seconds.
    # (and the worker looks for such tasks every second).
    broker_transport_options={
        "visibility_timeout": 3,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    imports=["django_rag.tasks"],
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    broker_connection_retry_on_startup=True,
)
