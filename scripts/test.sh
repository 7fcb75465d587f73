#!/usr/bin/env bash
# The whole test suite against real PostgreSQL + pgvector (embedded pgserver unless
# DATABASE_URL is set). Installs what it needs. Extra arguments go to pytest.
set -euo pipefail
. "$(dirname "$0")/bootstrap.sh"
ruff check .
python -m pytest "$@"
