"""Entry point of ``python -m mstx_marks``."""

import sys

from .cli import main

sys.exit(main())
