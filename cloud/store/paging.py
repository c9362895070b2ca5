"""Numbers read back from a page token: only what the database can compare.

A page token is opaque to clients, but it arrives from them: one decoded to a number beyond 64
bits made SQLite's driver raise OverflowError while binding it, and the caller got INTERNAL
instead of INVALID_ARGUMENT "page_token: not a page token from this server".
"""

from __future__ import annotations

_INT64 = range(-(2**63), 2**63)


def token_int(value: object) -> int:
    """`value` as an int a statement can bind on both backends; ValueError otherwise."""
    number: int = int(value)  # type: ignore[call-overload]
    if number not in _INT64:
        raise ValueError(f"{number} is out of range")
    return number
