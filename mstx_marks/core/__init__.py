"""The range API and what decides where each range goes.

:mod:`.ranges` (``mark``, ``mstx_range``, ``instant``) is built on :mod:`.engine` (start, end,
wrap), which reads the gates of :mod:`.routing` (settings, domain and rank filters, fault
containment with :mod:`.faults`); :mod:`.sampling` decides which calls are marked, :mod:`.off`
is the hard off switch and :mod:`.status` says where a process stands.
"""
