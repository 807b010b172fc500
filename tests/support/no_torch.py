"""A pytest plugin (``-p support.no_torch``) that makes ``import torch`` fail, as on a machine
without it."""

import sys

sys.modules["torch"] = None  # type: ignore[assignment]
