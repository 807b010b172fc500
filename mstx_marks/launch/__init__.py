"""Reaching every process of a job without editing it: :mod:`.activate` reads the
``MSTX_MARKS_*`` environment, :mod:`.plugins` are the frameworks' entry points that call it, and
:mod:`.launcher` (``mstx-marks run``) puts a start-up hook (``_startup/``) on ``PYTHONPATH``.
"""
