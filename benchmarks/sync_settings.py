"""benchmarks/settings.py plus the test app whose models benchmarks/sync.py indexes."""

from benchmarks.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.syncapp"]  # noqa: F405
