"""``python -m django_rag.embedded upgrade PATH`` | ``version PATH`` | ``stop PATH``."""

from __future__ import annotations

import sys
from pathlib import Path

from ..exceptions import EmbeddedServerError, MissingDependency
from .binaries import PACKAGES, data_directory_version, server_major, server_package
from .server import stop_data_directory
from .upgrade import upgrade_data_directory


def main(argv: list[str] | None = None) -> int:
    """``python -m django_rag.embedded upgrade PATH`` | ``version PATH`` | ``stop PATH``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m django_rag.embedded",
        description="Inspect, upgrade or stop an embedded PostgreSQL data directory.",
    )
    parser.add_argument("action", choices=["upgrade", "version", "stop"])
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    path = args.path.resolve()
    try:
        if args.action == "stop":
            stopped = stop_data_directory(path)
            print(f"Stopped the server of {path}." if stopped else f"No server runs on {path}.")
            return 0
        module = server_package()
        server, data = server_major(module), data_directory_version(path)
        if args.action == "version":
            print(
                f"data directory: PostgreSQL {data or '(none)'}; embedded server: PostgreSQL "
                f"{server} ({PACKAGES.get(module.__name__, module.__name__)})"
            )
            return 0 if data in (None, server) else 1
        kept = upgrade_data_directory(path)
    except (EmbeddedServerError, MissingDependency) as exc:
        print(exc, file=sys.stderr)
        return 1
    if kept is None:
        state = f"is already PostgreSQL {server}" if data else "does not exist yet"
        print(f"Nothing to upgrade: {path} {state}.")
    else:
        print(
            f"Upgraded {path} from PostgreSQL {data} to {server}; the old files are in {kept} "
            "(delete them once you no longer need them)."
        )
    return 0
