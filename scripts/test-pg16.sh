#!/usr/bin/env bash
# The search, ingest and re-embed tests again on the older embedded server: pgserver 0.1.4,
# PostgreSQL 16.2 + pgvector 0.6.2 (no iterative index scans), so the code paths for such
# servers keep working. .venv-pg16 is a venv that sees every package of .venv (one .pth file)
# plus pgserver; DJANGO_RAG_EMBEDDED_PACKAGE=pgserver picks it, and a test fails unless the
# run is really on pgvector 0.6. Installs what it needs. Extra arguments go to pytest.
set -euo pipefail
. "$(dirname "$0")/bootstrap.sh"
main_site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -x .venv-pg16/bin/python ]; then
  python -m venv --without-pip .venv-pg16
fi
old_site="$(.venv-pg16/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$main_site')" >"$old_site/django_rag_main_venv.pth"
if [ ! -f "$old_site/pgserver/__init__.py" ]; then
  python -m pip install -q --no-deps --target "$old_site" "pgserver==0.1.4"
fi
# shellcheck disable=SC1091
. .venv-pg16/bin/activate
unset DATABASE_URL
export DJANGO_RAG_EMBEDDED_PACKAGE=pgserver DJANGO_RAG_EXPECT_PGVECTOR=0.6 DJANGO_RAG_EXPECT_POSTGRESQL=16
python -m pytest "$@" \
  tests/test_embedded.py tests/test_checks.py \
  tests/test_search.py tests/test_filtered_search.py tests/test_fulltext.py \
  tests/test_ingest.py tests/test_reembed.py tests/test_vector_stores.py tests/test_search_budget.py \
  tests/test_vector_index.py tests/test_hybrid_statement.py
