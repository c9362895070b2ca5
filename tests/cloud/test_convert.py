"""Rows to protobuf: the hand-written conversions agree with protobuf's own."""

from __future__ import annotations

import datetime as dt

from google.protobuf import timestamp_pb2
from hypothesis import given
from hypothesis import strategies as st

from cloud.store import convert


@given(
    st.datetimes(
        min_value=dt.datetime(1, 1, 2),
        max_value=dt.datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [dt.UTC, dt.timezone(dt.timedelta(hours=-5)), dt.timezone(dt.timedelta(hours=13))]
        ),
    )
)
def test_ts_is_timestamp_from_datetime(value: dt.datetime) -> None:
    """Any aware datetime, before or after the epoch, in any offset: what FromDatetime gives."""
    expected = timestamp_pb2.Timestamp()
    expected.FromDatetime(value.astimezone(dt.UTC))
    assert convert.ts(value) == expected
    assert convert.ts(value).ToDatetime(dt.UTC) == value


def test_ts_takes_a_naive_datetime_as_local_time() -> None:
    naive = dt.datetime(2026, 12, 2, 10, 30, 0, 123456)
    assert convert.ts(naive) == convert.ts(naive.astimezone(dt.UTC))
