"""The largest numbers a request can carry to the cloud, for the JSON API's models and the
command line's options alike, and how a number typed into a form is read (`whole_number`).

Only what cannot even be encoded is kept out here (protobuf refused it with a ValueError: the
command line's "unexpected" exit 70, the API's 500); an ordinary wrong value still reaches the
cloud, whose message names its own, far lower, range.
"""

from __future__ import annotations

from typing import Final

#: The largest number a request's int32 fields carry (attempts, steps).
INT32_MAX: Final = 2**31 - 1
#: The largest number a request's int64 fields carry (a token budget).
INT64_MAX: Final = 2**63 - 1
#: The longest lease or timeout a request may ask for: ten years, the cloud's own cap on a
#: task's timeout (its leases are capped far below that, by its settings).
MAX_SECONDS: Final = 10 * 365 * 24 * 3600.0


def whole_number(text: str) -> int | None:
    """`text` as a whole number written in ASCII digits, else None.

    int() also reads the digits of other scripts ("٣", "３": 3), underscores ("1_0": 10) and a
    sign, so a form took them for a number nobody typed; the JSON API and the command line's
    options (both parsed by pydantic) take 0-9 only, and so does everything that uses this."""
    return int(text) if text.isascii() and text.isdigit() else None
