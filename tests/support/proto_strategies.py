"""Hypothesis strategies that build any protobuf message from its descriptor, hostile by design.

Every field gets values a careless server trips on: empty and huge strings (100 KB), control and
non-Latin characters, path and SQL fragments, integer limits, unknown enum numbers, NaN and
infinities, out-of-range timestamps and durations, repeated fields, several members of a oneof.
Strings are always valid UTF-8 (a protobuf client cannot send anything else).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

OVERSIZE = 100_000
_TRICKY_STRINGS = [
    "",
    " ",
    "\x00",
    "\n\r\t",
    "../../../etc/passwd",
    "' OR 1=1; --",
    "%s%n%x",
    "e1",
    "emulator-5554",
    "00000000000000000000000000000000",
    "😀" * 50,
    "a" * 201,
    "x" * OVERSIZE,
    "é" * (OVERSIZE // 2),
]
_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
STRINGS = st.one_of(st.sampled_from(_TRICKY_STRINGS), _text)
BYTES = st.one_of(st.binary(max_size=64), st.just(b"\x00" * OVERSIZE), st.just(b"\x89PNG\r\n"))


def _ints(bits: int, signed: bool) -> st.SearchStrategy[int]:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    edges = sorted({lo, hi, 0, 1, min(hi, 2), max(lo, -1), min(hi, 10_000), min(hi, 2**31 - 1)})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_STRING: STRINGS,
    FieldDescriptor.TYPE_BYTES: BYTES,
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_INT32: _ints(32, True),
    FieldDescriptor.TYPE_SINT32: _ints(32, True),
    FieldDescriptor.TYPE_SFIXED32: _ints(32, True),
    FieldDescriptor.TYPE_INT64: _ints(64, True),
    FieldDescriptor.TYPE_SINT64: _ints(64, True),
    FieldDescriptor.TYPE_SFIXED64: _ints(64, True),
    FieldDescriptor.TYPE_UINT32: _ints(32, False),
    FieldDescriptor.TYPE_FIXED32: _ints(32, False),
    FieldDescriptor.TYPE_UINT64: _ints(64, False),
    FieldDescriptor.TYPE_FIXED64: _ints(64, False),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True, allow_infinity=True),
}


def _field(field: FieldDescriptor, depth: int, overrides: dict[str, Any]) -> Any:
    if field.full_name in overrides:
        return overrides[field.full_name]
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None  # set for every message field
        return messages(field.message_type, depth + 1, overrides)
    if field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None  # set for every enum field
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-3, 40))
    return _SCALARS[field.type]


def messages(
    descriptor: Descriptor, depth: int = 0, overrides: dict[str, Any] | None = None
) -> st.SearchStrategy[Message]:
    """Any message of `descriptor`'s type; `overrides` maps a field's full name to a strategy."""
    overrides = overrides or {}
    cls = message_factory.GetMessageClass(descriptor)
    if depth > 3:
        return st.builds(cls)
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue  # no map fields in our protos; skip rather than guess
        value = _field(field, depth, overrides)
        is_repeated = field.is_repeated
        optional[field.name] = st.lists(value, max_size=3) if is_repeated else value
    return st.fixed_dictionaries({}, optional=optional).map(lambda kw: _build(cls, kw))


def _build(cls: Any, values: dict[str, Any]) -> Message:
    msg: Message = cls()
    for name, value in values.items():
        field = msg.DESCRIPTOR.fields_by_name[name]
        if field.is_repeated:
            target = getattr(msg, name)
            for item in value:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    target.add().CopyFrom(item)
                else:
                    target.append(item)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, name).CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


def field_names(descriptor: Descriptor, seen: set[str] | None = None) -> set[str]:
    """Every field name reachable from `descriptor` (what a refusal may name)."""
    seen = set() if seen is None else seen
    if descriptor.full_name in seen:
        return set()
    seen.add(descriptor.full_name)
    names: set[str] = set()
    for field in descriptor.fields:
        names.add(field.name)
        if field.message_type is not None:
            names |= field_names(field.message_type, seen)
    return names
