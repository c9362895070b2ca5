"""The fleet's mutual TLS for in-test gRPC servers and channels, from a folder `cloud.pki` wrote.

A test that stands in for the cloud (a fake LeaseService, a PlannerService, a server that is no
amc cloud at all) must present the fleet's server certificate and demand a client certificate
the fleet CA signed, as the cloud does (`cloud.server.server_credentials`): otherwise the host's
handshake, not the behaviour under test, decides what the test sees.
"""

from __future__ import annotations

from pathlib import Path

import grpc


def server_credentials(pki_dir: Path) -> grpc.ServerCredentials:
    """The cloud's side of the handshake: `server.pem`/`server.key`, client certificates of
    `ca.pem` required."""
    return grpc.ssl_server_credentials(
        [((pki_dir / "server.key").read_bytes(), (pki_dir / "server.pem").read_bytes())],
        root_certificates=(pki_dir / "ca.pem").read_bytes(),
        require_client_auth=True,
    )


async def start_mtls(server: grpc.aio.Server, pki_dir: Path, port: int = 0) -> int:
    """Listen on loopback `port` (0: a free one) with the fleet's mTLS and start `server`, its
    services already added; the port it listens on. Stopping it stays the caller's."""
    bound: int = server.add_secure_port(f"127.0.0.1:{port}", server_credentials(pki_dir))
    await server.start()
    return bound


def channel_credentials(pki_dir: Path, identity: str | None) -> grpc.ChannelCredentials:
    """A client's side of the handshake: trusting `ca.pem`, presenting `identity`
    ("host-a", "operator-ops") or no client certificate (which the cloud refuses)."""
    ca = (pki_dir / "ca.pem").read_bytes()
    if identity is None:
        return grpc.ssl_channel_credentials(root_certificates=ca)
    return grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(pki_dir / f"{identity}.key").read_bytes(),
        certificate_chain=(pki_dir / f"{identity}.pem").read_bytes(),
    )


def sync_channel(address: str, pki_dir: Path, identity: str | None) -> grpc.Channel:
    """A synchronous mTLS channel presenting `identity` or none (`channel_credentials`)."""
    return grpc.secure_channel(address, channel_credentials(pki_dir, identity))
