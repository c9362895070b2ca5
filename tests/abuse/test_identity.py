"""Identity abuse: who the certificate says you are decides what you may touch.

Proves: a client certificate from another CA and an expired one (signed by the real fleet CA)
never get past the TLS handshake; a fleet-signed certificate without an amc identity is refused;
host A's certificate cannot renew, finish or plan on host B's lease (and B's lease is untouched);
every operator RPC refuses a host certificate and every host RPC an operator certificate, with
PERMISSION_DENIED and a reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from amc.v1 import (
    artifact_service_pb2,
    decision_log_service_pb2,
    fleet_service_pb2,
    flow_service_pb2,
    lease_service_pb2,
    planner_service_pb2,
    progress_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud import pki
from cloud.authz import ACCESS
from tests.abuse.conftest import AbuseCloud
from tests.cloud.cloud_harness import ScriptedHost, hello, renewal, result
from tests.support.mtls import sync_channel

OPERATOR_SERVICES = (
    task_service_pb2,
    progress_service_pb2,
    fleet_service_pb2,
    decision_log_service_pb2,
    artifact_service_pb2,
    flow_service_pb2,
)


def _issue(
    ca: pki.CertPair,
    sans: Sequence[x509.GeneralName],
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> tuple[bytes, bytes]:
    """A client certificate signed by `ca` with the validity window and SANs given."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "abuse")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _install(pki_dir: Path, target: Path, name: str, pair: tuple[bytes, bytes]) -> Path:
    """A PKI folder trusting the real server, holding the client certificate `name`."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "ca.pem").write_bytes((pki_dir / "ca.pem").read_bytes())
    (target / f"{name}.pem").write_bytes(pair[0])
    (target / f"{name}.key").write_bytes(pair[1])
    return target


def _get_task(ch: grpc.Channel) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        ch.unary_unary(
            "/amc.v1.TaskService/GetTask",
            request_serializer=task_service_pb2.GetTaskRequest.SerializeToString,
        )(task_service_pb2.GetTaskRequest(task_id="x"), timeout=5)
    return err.value


def _open_lease(ch: grpc.Channel) -> grpc.RpcError:
    stub = ch.stream_stream(
        "/amc.v1.LeaseService/Lease",
        request_serializer=lease_service_pb2.LeaseRequest.SerializeToString,
        response_deserializer=lease_service_pb2.LeaseResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as err:
        list(stub(iter([hello(["p"])]), timeout=5))
    return err.value


NOW = dt.datetime.now(dt.UTC)
HOST = [x509.UniformResourceIdentifier("amc://host/a")]
OPERATOR = [x509.UniformResourceIdentifier("amc://operator/ops")]


DAY = dt.timedelta(days=1)
WINDOWS = {
    "expired": (NOW - 30 * DAY, NOW - DAY),
    "not yet valid": (NOW + DAY, NOW + 2 * DAY),
    "valid": (NOW - dt.timedelta(minutes=5), NOW + DAY),
}


@pytest.mark.parametrize(
    ("case", "signer", "window"),
    [
        ("wrong CA", "rogue", "valid"),
        ("expired", "fleet", "expired"),
        ("not yet valid", "fleet", "not yet valid"),
    ],
)
def test_untrusted_certificates_fail_the_handshake(
    abuse_cloud: AbuseCloud, tmp_path: Path, case: str, signer: str, window: str
) -> None:
    ca = pki.load_ca(abuse_cloud.pki_dir) if signer == "fleet" else pki.create_ca("rogue CA")
    for name, sans in (("host-a", HOST), ("operator-ops", OPERATOR)):
        pair = _issue(ca, sans, *WINDOWS[window])
        folder = _install(abuse_cloud.pki_dir, tmp_path / name, name, pair)
        with sync_channel(abuse_cloud.address, folder, name) as ch:
            err = _get_task(ch) if name.startswith("operator") else _open_lease(ch)
            # The TLS handshake fails: the call never reaches a servicer.
            assert err.code() == grpc.StatusCode.UNAVAILABLE, (case, name, err)
    abuse_cloud.assert_serving()


def test_fleet_signed_certificate_without_identity_is_refused(
    abuse_cloud: AbuseCloud, tmp_path: Path
) -> None:
    ca = pki.load_ca(abuse_cloud.pki_dir)
    for name, sans in (
        ("anon", []),
        ("dns-only", [x509.DNSName("a.example")]),
        ("other-scheme", [x509.UniformResourceIdentifier("spiffe://fleet/host/a")]),
        ("bad-kind", [x509.UniformResourceIdentifier("amc://admin/root")]),
    ):
        pair = _issue(ca, sans, NOW - dt.timedelta(minutes=5), NOW + dt.timedelta(days=1))
        folder = _install(abuse_cloud.pki_dir, tmp_path / name, name, pair)
        with sync_channel(abuse_cloud.address, folder, name) as ch:
            err = _get_task(ch)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (name, err)
            assert err.details(), name
            err = _open_lease(ch)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (name, err)
            assert err.details(), name


def _methods(modules: tuple[Any, ...]) -> list[Any]:
    """The operators' RPCs of these services (the access table says which: a service may also
    have a host's RPC, as DecisionLogService.ShipDecisions)."""
    return [
        m
        for module in modules
        for service in module.DESCRIPTOR.services_by_name.values()
        for m in service.methods
        if ACCESS[f"/{service.full_name}/{m.name}"].allowed == frozenset({"operator"})
    ]


@pytest.mark.parametrize(
    "method", _methods(OPERATOR_SERVICES), ids=lambda m: f"{m.containing_service.name}.{m.name}"
)
def test_operator_rpcs_refuse_a_host_certificate(abuse_cloud: AbuseCloud, method: Any) -> None:
    from google.protobuf import message_factory

    request = message_factory.GetMessageClass(method.input_type)()
    path = f"/{method.containing_service.full_name}/{method.name}"
    serialize = type(request).SerializeToString
    with abuse_cloud.channel("host-a") as ch:
        if method.server_streaming:
            stream: Any = ch.unary_stream(path, request_serializer=serialize)(request, timeout=5)
            with pytest.raises(grpc.RpcError) as err:
                next(iter(stream))
        else:
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary(path, request_serializer=serialize)(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "operator" in (err.value.details() or "")


def test_host_rpcs_refuse_an_operator_certificate(abuse_cloud: AbuseCloud) -> None:
    with abuse_cloud.channel("operator-ops") as ch:
        err = _open_lease(ch)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "host" in (err.details() or "")
        with pytest.raises(grpc.RpcError) as refused:
            ch.unary_unary(
                "/amc.v1.PlannerService/Decide",
                request_serializer=planner_service_pb2.DecideRequest.SerializeToString,
            )(planner_service_pb2.DecideRequest(task_id="x", attempt=1, lease_id="y"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "host" in (refused.value.details() or "")
        for path, message in (
            (
                "/amc.v1.DecisionLogService/ShipDecisions",
                decision_log_service_pb2.ShipDecisionsRequest(),
            ),
            (
                "/amc.v1.ArtifactService/UploadStepScreenshot",
                artifact_service_pb2.UploadStepScreenshotRequest(task_id="x"),
            ),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                ch.unary_unary(path, request_serializer=type(message).SerializeToString)(
                    message, timeout=5
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, path
            assert "host" in (refused.value.details() or ""), path


async def test_host_a_cannot_touch_host_b_lease(abuse_cloud: AbuseCloud) -> None:
    address, pki_dir = abuse_cloud.address, abuse_cloud.pki_dir
    b = ScriptedHost(address, pki_dir, "b")
    a = ScriptedHost(address, pki_dir, "a")
    ops = grpc.aio.secure_channel(
        address,
        grpc.ssl_channel_credentials(
            root_certificates=(pki_dir / "ca.pem").read_bytes(),
            private_key=(pki_dir / "operator-ops.key").read_bytes(),
            certificate_chain=(pki_dir / "operator-ops.pem").read_bytes(),
        ),
    )
    try:
        await b.connect(["b-phone"])
        # A has no phone: the replica is shared by the session's abuse tests, and a task another
        # test left queued would otherwise be assigned to A while it waits for a refusal.
        await a.connect([])
        submit: Any = ops.unary_unary(
            "/amc.v1.TaskService/SubmitTask",
            request_serializer=task_service_pb2.SubmitTaskRequest.SerializeToString,
            response_deserializer=task_service_pb2.SubmitTaskResponse.FromString,
        )
        await submit(
            task_service_pb2.SubmitTaskRequest(
                goal="b's job", target=types_pb2.TaskTarget(host_id="b")
            )
        )
        assignment = (await b.next("assignment")).assignment

        # A names B's exact task, attempt and lease id: fenced off, stream stays up.
        await a.send(renewal(assignment, 5, "hijacked"))
        refused = (await a.next("revoked")).revoked
        assert refused.reason == lease_service_pb2.REVOKE_REASON_PERMISSION_DENIED
        assert "permission denied" in refused.message.lower()
        await a.send(result(assignment, summary="hijacked"))
        refused = (await a.next("revoked")).revoked
        assert refused.reason == lease_service_pb2.REVOKE_REASON_PERMISSION_DENIED
        assert "permission denied" in refused.message.lower()

        planner: Any = a._channel.unary_unary(
            "/amc.v1.PlannerService/Decide",
            request_serializer=planner_service_pb2.DecideRequest.SerializeToString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await planner(
                planner_service_pb2.DecideRequest(
                    task_id=assignment.task_id,
                    attempt=assignment.attempt,
                    lease_id=assignment.lease_id,
                    system_prompt="s",
                    user_prompt="u",
                ),
                timeout=10,
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value
        assert err.value.details()

        # B's lease is untouched: it renews and finishes normally.
        await b.send(renewal(assignment, 1, "mine"))
        assert (await b.next("renewed")).renewed.lease_id == assignment.lease_id
        await b.send(result(assignment))
        ack = (await b.next("result_ack")).result_ack
        assert ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
        assert not ack.duplicate
        get: Any = ops.unary_unary(
            "/amc.v1.TaskService/GetTask",
            request_serializer=task_service_pb2.GetTaskRequest.SerializeToString,
            response_deserializer=task_service_pb2.GetTaskResponse.FromString,
        )
        task = (await get(task_service_pb2.GetTaskRequest(task_id=assignment.task_id))).task
        assert task.host_id == "b"
        assert task.result_summary == "done"
        assert "hijacked" not in str(task)
    finally:
        await a.close()
        await b.close()
        await ops.close()
