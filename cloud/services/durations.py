"""`google.protobuf.Duration`s as clients send them: checked before they are read.

A Duration is valid only with |nanos| below a second and nanos of the sign of seconds (or
zero), within ±10,000 years (google/protobuf/duration.proto). Python's protobuf reads any
pair without complaint, so `seconds=10, nanos=-500_000_000` was taken for 9.5 s and
`nanos=1_500_000_000` added a second and a half: a client's mistake became a value nobody sent.
"""

from __future__ import annotations

from google.protobuf import duration_pb2

_MAX_SECONDS = 315_576_000_000
_MAX_NANOS = 999_999_999


def problem(field: str, d: duration_pb2.Duration) -> str | None:
    """The INVALID_ARGUMENT text for a Duration that is not one, naming `field`, or None."""
    valid = (
        abs(d.seconds) <= _MAX_SECONDS
        and abs(d.nanos) <= _MAX_NANOS
        and (d.seconds == 0 or d.nanos == 0 or (d.seconds > 0) == (d.nanos > 0))
    )
    if valid:
        return None
    return (
        f"{field}: not a valid Duration (nanos -999,999,999 to 999,999,999, of the sign of seconds)"
    )


def seconds(d: duration_pb2.Duration) -> float:
    """A valid Duration in seconds, without the OverflowError `ToTimedelta` raises on huge
    values."""
    return d.seconds + d.nanos / 1e9
