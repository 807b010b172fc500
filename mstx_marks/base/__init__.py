"""The ground floor: what every other part reads and nothing here imports from them.

The environment variables (:mod:`.env`), warnings (:mod:`.diagnostics`), argument checks
(:mod:`.checks`), range names and domains (:mod:`.names`), the record types every reader and
exporter shares (:mod:`.records`) and the registry of RL phase names (:mod:`.phases`).
"""

#: The package version (pyproject.toml reads it from here).
VERSION = "0.1.0"
