"""The rules every range name and domain name must satisfy.

MSTX itself only rejects empty or non-``str`` messages, but the CANN tools that read the data
document stricter limits: a message of at most 156 UTF-8 bytes for the Ascend PyTorch profiler and
msprof, and domain names made of letters, digits and ``_``. A name also may not hold a NUL or
another control character (the C layer cuts at a NUL; the tools' CSV and tables break on the
rest) nor a lone surrogate (it cannot be encoded as UTF-8, so the C call itself would raise).
Checking them here, once, when a range is defined, keeps every later call free of checks.

>>> check_name("update_actor")
'update_actor'
>>> check_domain("verl")
'verl'
"""

from __future__ import annotations

import re

from mstx_marks.base.diagnostics import warn_once

__all__ = [
    "DEFAULT_DOMAIN",
    "MAX_NAME_BYTES",
    "SAFE_CHARS",
    "check_domain",
    "check_name",
    "fit_name",
    "plain",
]

DEFAULT_DOMAIN = "default"
MAX_NAME_BYTES = 156

# A str of at most this many characters cannot exceed MAX_NAME_BYTES (UTF-8 uses <= 4 bytes a
# character), so the common short name skips the encode.
SAFE_CHARS = MAX_NAME_BYTES // 4
_DOMAIN_RE = re.compile(r"[A-Za-z0-9_]+\Z")
# C0 controls, DEL, C1 controls and lone surrogates: what a name may not hold.
_UNFIT = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


def plain(name: str) -> bool:
    """Whether ``name`` holds no control character and no lone surrogate; a C-speed check for
    the usual printable name, the exact one only for the rest.

    >>> plain("update_actor"), plain("a" + chr(0) + "b"), plain("café" + chr(0xA0))
    (True, False, True)
    """
    return name.isprintable() or _UNFIT.search(name) is None


def _check_type(name: object, what: str) -> str:
    if type(name) is not str and not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ValueError(f"{what} must be a non-empty str, got {name!r}")
    return name


def _utf8_len(name: str) -> int:
    return len(name) if len(name) <= SAFE_CHARS else len(name.encode("utf-8", "surrogatepass"))


def check_name(name: object, what: str = "range name") -> str:
    """Return ``name`` if it is a valid MSTX message, else raise naming the value and the rule.

    >>> check_name("é" * 80)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: range name 'ééé...'... is 160 UTF-8 bytes; MSTX allows at most 156
    """
    name = _check_type(name, what)
    if not plain(name):
        bad = _UNFIT.search(name)
        raise ValueError(
            f"{what} {name[:SAFE_CHARS]!r} holds {name[bad.start()]!r} at index {bad.start()}"
            if bad
            else f"{what} {name!r} holds a character MSTX cannot carry"
        )
    size = _utf8_len(name)
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"{what} {name[:SAFE_CHARS]!r}... is {size} UTF-8 bytes; "
            f"MSTX allows at most {MAX_NAME_BYTES}"
        )
    return name


def fit_name(name: object, what: str = "range name") -> str:
    """Like :func:`check_name`, but cut an over-long name to the limit and replace characters
    a name may not hold by U+FFFD, each with one warning.

    For names built at run time (``mark(f"micro_batch{i}")``), where an error would break the
    workload being observed. Empty and non-``str`` names are still refused.

    >>> len(fit_name("é" * 100).encode()), fit_name("tab" + chr(9) + "here") == "tab\ufffdhere"
    (156, True)
    """
    name = _check_type(name, what)
    if not plain(name):
        warn_once(
            "unfit name",
            f"{what} {name[:SAFE_CHARS]!r} holds control characters or lone surrogates;"
            " they are replaced by U+FFFD (warned once)",
        )
        name = _UNFIT.sub(_REPLACEMENT, name)
    if _utf8_len(name) <= MAX_NAME_BYTES:
        return name
    warn_once(
        "truncated name",
        f"{what} {name[:SAFE_CHARS]!r}... is longer than MSTX's {MAX_NAME_BYTES} UTF-8 bytes;"
        " it is truncated (warned once)",
    )
    return name.encode("utf-8", "surrogatepass")[:MAX_NAME_BYTES].decode("utf-8", "ignore")


def check_domain(domain: object) -> str:
    """Return ``domain`` if it is a valid MSTX domain name (letters, digits, ``_``), else raise.

    >>> check_domain("vllm-one-step")
    Traceback (most recent call last):
    ...
    ValueError: domain 'vllm-one-step' must be ASCII letters, digits and '_' only
    """
    domain = _check_type(domain, "domain")
    if not _DOMAIN_RE.match(domain):
        raise ValueError(f"domain {domain!r} must be ASCII letters, digits and '_' only")
    return domain
