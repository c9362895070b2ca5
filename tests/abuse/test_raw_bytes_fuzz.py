"""Raw request bytes at every method the cloud serves, on SQLite and PostgreSQL.

grpc.aio parses a request before any servicer runs, and a parse failure used to surface as
UNKNOWN ("Unexpected DecodeError"). Here every method in the access table (`cloud.authz.ACCESS`
is exactly what the cloud serves: a test in tests/cloud checks that) gets bytes straight off
the wire, with the caller kind it allows: random bytes, valid messages cut short or with bytes
flipped, and valid messages whose text fields hold arbitrary bytes (invalid UTF-8, NULs) — built
from a twin of the request type whose text fields are bytes (`cloud.wire.bytes_twin`). A summary
that is not UTF-8 is mended, not refused (`cloud.wire.SANITISED`): such a request is usable.

Proves: no answer is UNKNOWN, INTERNAL, UNAVAILABLE or UNIMPLEMENTED; a refusal says why, and an
INVALID_ARGUMENT names the request or one of its fields; a request whose text is not UTF-8 is
refused as exactly that, naming the field ("…: not valid UTF-8"); on the Lease stream, each
message that does not parse is answered in-stream and the stream stays usable; the replica
still answers its health check afterwards.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amc.v1 import lease_service_pb2 as lease_pb
from cloud.authz import ACCESS
from cloud.wire import bytes_twin, repaired
from tests.abuse.conftest import AbuseCloud, first_said
from tests.support.proto_strategies import field_names, messages

pytestmark = pytest.mark.filterwarnings(
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)

FORBIDDEN = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def _method(path: str) -> Any:
    """The method descriptor of a full method name ("/pkg.Service/Method"). Reflection v1 is
    served with v1alpha's messages (`cloud/reflection.py`), so it is looked up as v1alpha."""
    service, name = path.strip("/").split("/")
    service = service.replace("grpc.reflection.v1.", "grpc.reflection.v1alpha.")
    return descriptor_pool.Default().FindServiceByName(service).methods_by_name[name]


def _identity(path: str) -> str:
    allowed = ACCESS[path].allowed
    return "host-fuzz" if allowed == {"host"} else "operator-ops"


METHODS = sorted(ACCESS)


def _mutations(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """Bytes near a valid request: cut short, a byte changed, garbage appended or inserted."""
    valid = messages(descriptor).map(lambda m: m.SerializeToString())

    def mutate(data: bytes, how: int, at: int, junk: bytes) -> bytes:
        if not data:
            return junk
        i = at % len(data)
        if how == 0:
            return data[:i]
        if how == 1:
            return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
        if how == 2:
            return data + junk
        return data[:i] + junk + data[i:]

    return st.builds(
        mutate, valid, st.integers(0, 3), st.integers(0, 10_000), st.binary(max_size=16)
    )


def _raw(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    twin = bytes_twin(descriptor)
    wild_text = messages(twin.DESCRIPTOR).map(lambda m: m.SerializeToString())
    return st.one_of(st.binary(max_size=300), _mutations(descriptor), wild_text)


#: Requests of the methods that refuse records alone (`cloud.boundary.PER_RECORD`).
PER_RECORD_REQUESTS = frozenset({"amc.v1.ShipDecisionsRequest"})


def _parses(cls: Any, raw: bytes) -> bool:
    try:
        cls.FromString(raw)
    except DecodeError:
        return False
    return True


def _usable(descriptor: Descriptor, raw: bytes) -> bool:
    """The bytes parse, or parse once the replica mended the summaries that hold bytes that are
    not UTF-8 (`cloud.wire.repaired`: a summary is never a reason to refuse a message)."""
    real = message_factory.GetMessageClass(descriptor)
    return _parses(real, raw) or isinstance(repaired(descriptor, raw), bytes)


def _check(
    err: grpc.RpcError | None, descriptor: Descriptor, raw: bytes, ours: bool = True
) -> None:
    """`ours`: an amc method (gRPC's own health and reflection services answer some refusals,
    like NOT_FOUND for an unknown service name, without details)."""
    real = message_factory.GetMessageClass(descriptor)
    twin = bytes_twin(descriptor)
    # A method that refuses records alone reads a request whose text is not UTF-8 record by
    # record (`cloud.services.shipping.records_apart`): usable whenever its bytes twin parses,
    # each unreadable record refused alone (the whole call only when none can be taken, with
    # the first refused record's reason, which may be another problem of that record).
    per_record = descriptor.full_name in PER_RECORD_REQUESTS and _parses(twin, raw)
    parses = per_record or _usable(descriptor, raw)
    # The text it ends up with is not UTF-8 (a field given twice keeps its last value, and an
    # earlier, overwritten bad value is refused by the parser without a field to name).
    bad_text = _parses(twin, raw) and not _parses(real, twin.FromString(raw).SerializeToString())
    if err is None:
        assert parses, f"an unparsable request was accepted: {raw[:80]!r}"
        return
    code, details = err.code(), err.details() or ""
    # grpcio-health-checking's asyncio servicer does not implement Health.List.
    forbidden = FORBIDDEN if ours else FORBIDDEN - {grpc.StatusCode.UNIMPLEMENTED}
    assert code not in forbidden, f"{code} {details!r} for {raw[:120]!r}"
    if ours or code == grpc.StatusCode.INVALID_ARGUMENT:
        assert len(details.strip()) >= 5, f"{code} without a reason for {raw[:120]!r}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        named = details.split(":", 1)[0].replace("[", ".").split(".")
        names = field_names(descriptor) | {"request"}
        assert any(n in names for n in named), f"{details!r} names no field"
    if not parses:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{code} {details!r} for {raw[:120]!r}"
        if bad_text:
            assert details.endswith(": not valid UTF-8"), details


def _unary(
    ch: grpc.Channel, path: str, streaming: bool, raw: bytes, live: list[tuple[Any, bytes]]
) -> grpc.RpcError | None:
    """The request's refusal, or None. A stream the server accepted (its headers came, the call
    goes on) joins `live`, read after the last example: the accepted streams wait out their
    1 s deadline side by side, not one after another (as in test_rpc_fuzz.py)."""
    if streaming:
        call: Any = ch.unary_stream(path)(raw, timeout=1.0)
        call.initial_metadata()  # the headers of an accepted stream, or the call's end
        if not call.done():
            live.append((call, raw))
            return None
        return first_said(call)
    try:
        ch.unary_unary(path)(raw, timeout=10)
    except grpc.RpcError as err:
        return err
    return None


@pytest.mark.parametrize("path", [m for m in METHODS if not _method(m).client_streaming])
def test_raw_bytes_to_every_unary_request_method(any_abuse_cloud: AbuseCloud, path: str) -> None:
    method = _method(path)
    ours = path.startswith("/amc.v1.")
    live: list[tuple[Any, bytes]] = []
    with any_abuse_cloud.channel(_identity(path)) as ch:

        @FUZZ
        @given(raw=_raw(method.input_type))
        def one(raw: bytes) -> None:
            err = _unary(ch, path, method.server_streaming, raw, live)
            _check(err, method.input_type, raw, ours=ours)

        try:
            one()
            for call, raw in live:  # what each accepted stream said first, or its refusal
                _check(first_said(call), method.input_type, raw, ours=ours)
        finally:
            for call, _ in live:
                call.cancel()
    any_abuse_cloud.assert_serving()


def test_raw_bytes_on_the_lease_stream(any_abuse_cloud: AbuseCloud) -> None:
    """Each undecodable message is answered with Rejected (INVALID_ARGUMENT, naming the request
    or a field); the stream stays up, so a valid hello after them is welcomed."""
    hello = lease_pb.LeaseRequest(hello=lease_pb.HostHello(agent_version="raw/1"))
    with any_abuse_cloud.channel("host-fuzz") as ch:
        lease = ch.stream_stream("/amc.v1.LeaseService/Lease")

        @FUZZ
        @given(raws=st.lists(_raw(lease_pb.LeaseRequest.DESCRIPTOR), min_size=1, max_size=4))
        def one(raws: list[bytes]) -> None:
            unparsable = [r for r in raws if not _usable(lease_pb.LeaseRequest.DESCRIPTOR, r)]
            if len(unparsable) != len(raws):
                return  # parsable ones are the other fuzzer's business (test_lease_stream_fuzz)
            frames = list(lease(iter([*unparsable, hello.SerializeToString()]), timeout=15))
            answers = [lease_pb.LeaseResponse.FromString(f) for f in frames]
            rejected = [a.rejected for a in answers if a.WhichOneof("kind") == "rejected"]
            assert len(rejected) >= len(unparsable), answers
            for r in rejected[: len(unparsable)]:
                assert r.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], r
                assert r.message.startswith(("request:", "hello", "renewal", "result", "device")), r
            assert any(a.WhichOneof("kind") == "welcome" for a in answers), answers

        one()
    any_abuse_cloud.assert_serving()


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_raw_bytes_on_the_reflection_stream(any_abuse_cloud: AbuseCloud, version: str) -> None:
    path = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
    method = _method(path)
    with any_abuse_cloud.channel("operator-ops") as ch:
        call = ch.stream_stream(path)

        @FUZZ
        @given(raw=_raw(method.input_type))
        def one(raw: bytes) -> None:
            try:
                list(call(iter([raw]), timeout=10))
                err = None
            except grpc.RpcError as e:
                err = e
            _check(err, method.input_type, raw, ours=False)

        one()
    any_abuse_cloud.assert_serving()
