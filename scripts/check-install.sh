#!/usr/bin/env bash
# Installs django-rag as a new user would, then reads a file of each format with it.
#
# A fresh `python3 -m venv` keeps the pip it ships: no upgrade. (Python 3.11's pip is 23.x. It
# does not normalise a dependency's extra names, so it skips a package such as jusText's
# `lxml[html_clean]`, and `import trafilatura` then fails.) The script installs the extras that
# need no torch (default `formats,pdf`: HTML, Word, PowerPoint, Excel, email, PDF), imports every
# parser, and parses tests/fixtures/formats plus a PDF it makes. It fails when pip reports a
# skipped extra, an import fails or a file reads wrong.
#
#   bash scripts/check-install.sh                 # the default extras
#   bash scripts/check-install.sh html            # another set of extras
#   PYTHON=python3.12 bash scripts/check-install.sh
#
# It needs the package index (or a local mirror that pip is set up for), takes about half a
# minute, and leaves nothing behind (everything is in a temporary directory). .ci/run runs it
# last.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
EXTRAS="${1:-formats,pdf}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset PYTHONPATH DJANGO_SETTINGS_MODULE VIRTUAL_ENV
started=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/django-rag-install.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# pip builds a local project in place and would leave build/ in the checkout: build a copy.
mkdir "$work/src"
tar -C "$ROOT" --exclude=__pycache__ -cf - pyproject.toml README.md django_rag \
  | tar -C "$work/src" -xf -

"$PYTHON" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
echo "check-install: $("$venv_python" --version), $("$venv_python" -m pip --version | cut -d' ' -f1-2) (as the venv ships it), extras [$EXTRAS]"
if ! "$venv_python" -m pip install "$work/src[$EXTRAS]" >"$work/pip.log" 2>&1; then
  cat "$work/pip.log"
  echo "check-install: FAILED: pip install '.[$EXTRAS]'" >&2
  exit 1
fi
# What old pips print when they skip a dependency's extra. The install "works" all the same;
# whether the extra's package is then missing is for the imports below to tell (the `html`
# extra names lxml_html_clean itself, so jusText's skipped `lxml[html_clean]` is harmless).
grep -i "does not provide the extra" "$work/pip.log" | sed 's/^/check-install: pip said: /' || true
echo "check-install: installed in $((SECONDS - started)) s"

cd "$work"  # not the checkout: django_rag must come from the venv
"$venv_python" - "$ROOT/tests/fixtures/formats" "$EXTRAS" <<'EOF'
import importlib
import sys
from pathlib import Path

import django
from django.conf import settings

settings.configure(DJANGO_RAG={})
django.setup()

import django_rag  # noqa: E402
from django_rag.ingestion.parsers import parse_bytes  # noqa: E402

fixtures, extras = Path(sys.argv[1]), set(sys.argv[2].split(","))
if "formats" in extras:
    extras |= {"html", "docx", "pptx", "xlsx"}
installed = Path(django_rag.__file__).resolve()
assert str(installed).startswith(sys.prefix), f"django_rag came from {installed}, not the venv"

# extra -> (django_rag's parser module, what its library is imported as, a file, a phrase in it)
checks = {
    "html": ("html", "trafilatura", "saved_page.html", "forty days"),
    "docx": ("docx", "docx", "expense_policy.docx", "Travel expense policy"),
    "pptx": ("pptx", "pptx", "quarterly_review.pptx", "Revenue grew eleven percent"),
    "xlsx": ("spreadsheet", "openpyxl", "stock.xlsx", "| Road bike frame |"),
    "pdf": ("pdf", "pymupdf", None, "Refunds take five business days."),
}
failures = []
for extra, (module, library, filename, phrase) in checks.items():
    if extra not in extras:
        continue
    try:
        importlib.import_module(f"django_rag.ingestion.parsers.{module}")
        importlib.import_module(library)
        if filename is None:  # a one-page PDF, made with the library just installed
            import pymupdf

            pdf = pymupdf.open()
            pdf.new_page().insert_text((72, 72), phrase)
            data, filename = pdf.tobytes(), "made.pdf"
        else:
            data = (fixtures / filename).read_bytes()
        text = parse_bytes(data, filename=filename).text
        assert phrase in text, f"{phrase!r} is not in what {filename} read as: {text[:300]!r}"
        print(f"check-install: {extra:5} {filename:22} {len(text):5} characters")
    except Exception as exc:  # every format is tried; the failures are listed at the end
        failures.append(f"{extra}: {type(exc).__name__}: {exc}")

# Email needs no extra (the standard library); its attachments need theirs.
parsed = parse_bytes((fixtures / "cooling_failure.eml").read_bytes(), filename="a.eml")
if "Cooling failure in hall B" not in parsed.text:
    failures.append(f"eml: the subject is missing from {parsed.text[:300]!r}")
else:
    print(f"check-install: eml   cooling_failure.eml    {len(parsed.text):5} characters")

if failures:
    print("check-install: FAILED:", *failures, sep="\n  ", file=sys.stderr)
    sys.exit(1)
EOF
echo "check-install: OK in $((SECONDS - started)) s"
