#!/usr/bin/env bash
# A local LLM for benchmarks and the opt-in local-model tests (docs/llm.md#run-a-local-model).
#   scripts/local-llm.sh prepare   # llama-cpp-python (../shared/wheels when present) + the model
#   scripts/local-llm.sh serve [--port 8765] [--threads 2]
#   scripts/local-llm.sh test      # the opt-in tests against the real model
# On a shared machine keep the threads low: OMP_WAIT_POLICY=PASSIVE stops idle threads spinning.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
case "${1:-}" in
  prepare) shift; exec python benchmarks/local_llm.py prepare "$@" ;;
  serve) shift; exec python benchmarks/local_llm.py serve "$@" ;;
  test) shift; DJANGO_RAG_LOCAL_LLM=1 exec python -m pytest tests/test_local_llm.py -q "$@" ;;
  *) echo "usage: $0 prepare|serve|test [options]" >&2; exit 2 ;;
esac
