#!/usr/bin/env bash
# The whole test suite against real PostgreSQL + pgvector (the embedded server, PostgreSQL 18 +
# pgvector 0.8, unless DATABASE_URL is set). Installs what it needs. Extra arguments go to
# pytest. scripts/test-pg16.sh runs the search tests again on PostgreSQL 16 + pgvector 0.6.
set -euo pipefail
. "$(dirname "$0")/bootstrap.sh"
# The dashboard's browser tests drive Debian's headless Chromium (never a downloaded browser).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "Installing chromium and chromium-driver for the browser tests..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
    >/dev/null 2>&1 || echo "Could not install chromium: the browser tests will be skipped."
fi
ruff check .
lint-imports  # the layers and the absence of import cycles (pyproject.toml, docs/architecture.md)
mypy  # a misspelled option in the README's calls is a type error ([tool.mypy] in pyproject.toml)
if [ -z "${DATABASE_URL:-}" ]; then
  # tests/test_embedded.py fails unless the run is on the server the embedded default ships.
  export DJANGO_RAG_EXPECT_PGVECTOR="${DJANGO_RAG_EXPECT_PGVECTOR:-0.8+}"
  export DJANGO_RAG_EXPECT_POSTGRESQL="${DJANGO_RAG_EXPECT_POSTGRESQL:-18+}"
fi
python -m pytest "$@"
