"""How both consoles write a count: with thousands separators (`1,500`), as people read one."""

from __future__ import annotations

from typing import Any


def grouped(value: Any) -> str:
    """`1500` as `1,500`; anything that is not a whole number (a placeholder such as "—" for a
    count not recorded) as it is. The host console's usage table printed "1500" where the cloud
    console, showing the same step, says "1,500 tokens"."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
