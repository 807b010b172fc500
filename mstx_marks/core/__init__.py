"""The range API and what decides where each range goes.

:mod:`.ranges` (``mark``, ``mstx_range``, ``instant``, with each Mark's :mod:`.entries`) is
built on :mod:`.engine` (start, end, wrap), which reads the :mod:`.gates`; :mod:`.configuration`
turns ``configure`` and the environment into settings and routes the gates, with
:mod:`.detection` building the backend and :mod:`.faults` containing what it raises. All of it
is kept on one state object, :data:`.process.PROCESS`. :mod:`.sampling` decides which calls are
marked, :mod:`.off` is the hard off switch and :mod:`.status` says where a process stands.
"""

# The gates resolve their settings through calls that the configuration installs on the state
# when it is imported: import it with the package, so that any range site finds them.
from mstx_marks.core import configuration as configuration
