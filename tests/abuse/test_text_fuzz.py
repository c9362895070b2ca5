"""NUL characters in text fields, at every depth of every amc request, on SQLite and PostgreSQL.

PostgreSQL cannot store a NUL in text, so a NUL that got as far as the database used to answer
UNKNOWN and echo the SQL with its parameters. Each example takes a fuzzed request (see
`tests/support/proto_strategies.py`), puts a NUL at a random place in one of its text fields
(any depth, repeated or not) and sends it with the right certificate.

Proves: the answer is INVALID_ARGUMENT "<field path>: NUL characters are not allowed", and the
path leads, in the request as sent, to a field that does hold a NUL; nothing is stored (the
request never reaches a servicer); the replica still serves. ShipDecisions refuses records
alone (`boundary.PER_RECORD`): the record holding the NUL is named in `refused` and the others
taken, and a record holding one, sent alone, is INVALID_ARGUMENT for its NUL. Summaries a host
reports about finished work are the exception (sanitised, never refused): see
tests/cloud/test_boundary.py.
"""

from __future__ import annotations

import re
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amc.v1.decision_log_service_pb2 import ShipDecisionsResponse
from cloud.boundary import PER_RECORD
from cloud.wire import SANITISED
from tests.abuse.conftest import AbuseCloud
from tests.abuse.test_rpc_fuzz import METHODS
from tests.support.proto_strategies import messages

pytestmark = pytest.mark.filterwarnings(
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)


def _text_slots(
    message: Message, prefix: str = ""
) -> list[tuple[str, Message, FieldDescriptor, int | None]]:
    """Every set text field of `message`: (path, owner, field, index in a repeated field)."""
    out: list[tuple[str, Message, FieldDescriptor, int | None]] = []
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        if field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                out += [(f"{path}[{i}]", message, field, i) for i in range(len(value))]
            else:
                out.append((path, message, field, None))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            items = list(enumerate(value)) if field.is_repeated else [(None, value)]
            for i, item in items:
                out += _text_slots(item, f"{path}[{i}]." if i is not None else f"{path}.")
    return out


def _with_nul(message: Message, choice: int, position: int) -> Message | None:
    """`message` with a NUL put into one of its (non-sanitised) text fields; None if it has none."""
    slots = [s for s in _text_slots(message) if s[2].full_name not in SANITISED]
    if not slots:
        return None
    _, owner, field, index = slots[choice % len(slots)]
    value: str = (
        getattr(owner, field.name)[index] if index is not None else getattr(owner, field.name)
    )
    at = position % (len(value) + 1)
    changed = value[:at] + "\x00" + value[at:]
    if index is None:
        setattr(owner, field.name, changed)
    else:
        getattr(owner, field.name)[index] = changed
    return message


def _value_at(message: Any, path: str) -> Any:
    """The value a refusal's field path names ("devices[1].serial")."""
    value = message
    for part in path.split("."):
        match = re.fullmatch(r"(\w+)(?:\[(\d+)\])?", part)
        assert match, f"not a field path: {path!r}"
        value = getattr(value, match.group(1))
        if match.group(2) is not None:
            value = value[int(match.group(2))]
    return value


def _send(ch: grpc.Channel, method: MethodDescriptor, request: Message) -> grpc.RpcError | None:
    path = f"/{method.containing_service.full_name}/{method.name}"
    serialize = type(request).SerializeToString
    try:
        if method.server_streaming:
            call: Any = ch.unary_stream(path, request_serializer=serialize)(request, timeout=10)
            try:
                next(iter(call), None)
            finally:
                call.cancel()
        else:
            ch.unary_unary(path, request_serializer=serialize)(request, timeout=10)
    except grpc.RpcError as err:
        return err
    return None


def _check_per_record(ch: grpc.Channel, path: str, poisoned: Message) -> None:
    """A method that refuses records alone (ShipDecisions): the record holding the NUL is
    refused (named in the reply's `refused`), or the whole call is INVALID_ARGUMENT when none
    of its records can be taken (most fuzzed records name no lease)."""
    call = ch.unary_unary(
        path,
        request_serializer=type(poisoned).SerializeToString,
        response_deserializer=ShipDecisionsResponse.FromString,
    )
    try:
        reply = call(poisoned, timeout=10)
    except grpc.RpcError as err:
        refused_whole: grpc.RpcError | None = err
    else:
        refused_whole = None
    if refused_whole is not None:
        code = refused_whole.code()
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, refused_whole.details())
        # Refused whole, its details name the first refused record's problem, which need not be
        # the NUL: each record holding one is sent alone, and must be refused for its NUL.
        for field in ("entries", "failed_calls", "unsettled_calls"):
            for record in getattr(poisoned, field):
                if _holds_nul(record):
                    _check_alone(call, type(poisoned)(**{field: [record]}))
        return
    nul = [r.reason for r in reply.refused if r.reason.endswith(": NUL characters are not allowed")]
    assert nul, f"accepted a NUL: {str(poisoned)[:300]!r} -> {reply}"
    for reason in nul:
        where = reason.partition(": ")[0]
        assert "\x00" in _value_at(poisoned, where), (where, str(poisoned)[:300])


def _holds_nul(message: Message) -> bool:
    """Whether any text field of `message`, at any depth, holds a NUL."""
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for one in values:
            if isinstance(one, str) and "\x00" in one:
                return True
            if isinstance(one, Message) and _holds_nul(one):
                return True
    return False


def _check_alone(call: Any, alone: Message) -> None:
    """A ShipDecisions request of one record holding a NUL: refused whole (nothing else to
    take), for that NUL, named by its path."""
    with pytest.raises(grpc.RpcError) as refused:
        call(alone, timeout=10)
    details = refused.value.details() or ""
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details
    where, _, problem = details.partition(": ")
    assert problem == "NUL characters are not allowed", details
    assert "\x00" in _value_at(alone, where), (where, str(alone)[:300])


@pytest.mark.parametrize(
    ("method", "identity"),
    METHODS,
    ids=[f"{m.containing_service.name}.{m.name}" for m, _ in METHODS],
)
def test_a_nul_in_any_text_field_is_refused_naming_it(
    any_abuse_cloud: AbuseCloud, method: MethodDescriptor, identity: str
) -> None:
    with any_abuse_cloud.channel(identity) as ch:

        @settings(
            max_examples=60,
            deadline=None,
            suppress_health_check=[
                HealthCheck.function_scoped_fixture,
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
            ],
        )
        @given(
            request=messages(method.input_type),
            choice=st.integers(0, 1000),
            position=st.integers(0, 10_000),
        )
        def one(request: Message, choice: int, position: int) -> None:
            poisoned = _with_nul(request, choice, position)
            if poisoned is None:
                return  # no text field set in this example
            path = f"/{method.containing_service.full_name}/{method.name}"
            if path in PER_RECORD:
                _check_per_record(ch, path, poisoned)
                return
            err = _send(ch, method, poisoned)
            assert err is not None, f"accepted a NUL: {str(poisoned)[:300]!r}"
            code, details = err.code(), err.details() or ""
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
            path, _, problem = details.partition(": ")
            assert problem == "NUL characters are not allowed", details
            assert "\x00" in _value_at(poisoned, path), (path, str(poisoned)[:300])

        one()
    any_abuse_cloud.assert_serving()
