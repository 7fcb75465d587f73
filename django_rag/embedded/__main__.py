"""``python -m django_rag.embedded``: see :mod:`django_rag.embedded.cli`."""

import sys

from .cli import main

sys.exit(main())
