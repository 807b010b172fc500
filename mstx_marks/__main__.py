"""Entry point of ``python -m mstx_marks``."""

import sys

from mstx_marks.cli.main import main

sys.exit(main())
