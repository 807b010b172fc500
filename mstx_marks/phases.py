"""The registry of standard RL phase names.

>>> p = Phase("generate_sequences", framework="verl", description="rollout generation")
>>> p.name, p.domain
('generate_sequences', 'default')
"""

from __future__ import annotations

from .names import DEFAULT_DOMAIN, check_domain, check_name

__all__ = ["Phase"]


class Phase:
    """A named phase: usable wherever a range name is, as ``mark(PHASE)`` or ``@mstx_range(PHASE)``.

    Name and domain are checked once, here, so using a phase costs no more than a literal name.
    """

    __slots__ = ("aliases", "description", "domain", "framework", "name")

    name: str
    domain: str
    framework: str
    description: str
    aliases: tuple[str, ...]

    def __init__(
        self,
        name: str,
        domain: str | None = None,
        *,
        framework: str = "",
        description: str = "",
        aliases: tuple[str, ...] = (),
    ) -> None:
        self.name = check_name(name, "phase name")
        self.domain = DEFAULT_DOMAIN if domain is None else check_domain(domain)
        self.framework = framework
        self.description = description
        self.aliases = tuple(check_name(a, "phase alias") for a in aliases)

    def __repr__(self) -> str:
        dom = "" if self.domain == DEFAULT_DOMAIN else f", domain={self.domain!r}"
        return f"Phase({self.name!r}{dom})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Phase) and (self.name, self.domain) == (other.name, other.domain)

    def __hash__(self) -> int:
        return hash((self.name, self.domain))
