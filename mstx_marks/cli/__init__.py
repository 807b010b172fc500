"""The ``mstx-marks`` command: :mod:`.main` (the parser and every sub-command),
:mod:`.doctor` and :mod:`.demo`.
"""
