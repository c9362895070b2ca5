"""The servers under test, each in its own process so its CPU and memory can be read from /proc.

`python -m bench.servers KIND ...` prints `READY <host:port>` once it serves, then runs until
SIGTERM. Kinds:

* `cloud`: the real cloud replica (`cloud.server.build_server`), mTLS, on SQLite or PostgreSQL.
* `http`: the old design's renewal path: FastAPI + uvicorn, a JSON `POST /renew` per renewal, doing
  the same fenced UPDATE through the same store function (`cloud.store.leases.renew_batch`) in its
  own transaction per request. Plain HTTP/1.1 with keep-alive, no TLS (that favours the baseline).
* `adb`: virtual phones behind an adb server (for the host memory benchmark).
* `echo`: a bare grpc.aio LeaseService over the same mTLS credentials that answers a hello with a
  fake assignment and every renewal with `renewed`, touching no store: the machine's ceiling.

`ServerProcess` starts one from the benchmark process and stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import lease_service_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]


# ---- in the server process ------------------------------------------------------------------


async def _until_terminated() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _ready(address: str) -> None:
    print(f"READY {address}", flush=True)


class _DiscardingExporter:
    """A span exporter that takes every batch and keeps nothing: tracing's whole cost in this
    process (spans made, batched, handed to an exporter) without a collector to send to."""

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _trace_everything() -> None:
    """An SDK tracer provider exporting in batches, as `OTEL_EXPORTER_OTLP_ENDPOINT` would."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_DiscardingExporter()))  # type: ignore[arg-type]  # duck-typed exporter
    trace.set_tracer_provider(provider)


async def serve_cloud(
    database_url: str,
    pki_dir: Path,
    retention_days: float,
    observability: str = "default",
    listen: str = "127.0.0.1:0",
    pool_size: int = 0,
) -> None:
    """The real cloud replica. `observability`: "on" records metrics, serves them (the READY
    line's third word is the /metrics URL) and traces every span through a batch exporter;
    "off" records no metric and traces nothing; "default" records metrics, serves none.
    `pool_size`: its PostgreSQL pool's ceiling (0: the setting's default)."""
    from cloud import gc_policy, supervised
    from cloud.server import build_server
    from cloud.settings import CloudSettings
    from cloud.store.pool import DEFAULT_POOL_SIZE

    if observability == "on":
        _trace_everything()
    server = await build_server(
        CloudSettings(
            database_url=database_url,
            listen_address=listen,
            pki_dir=pki_dir,
            retention_days=retention_days,
            metrics_enabled=observability != "off",
            database_pool_size=pool_size or DEFAULT_POOL_SIZE,
        )
    )
    await server.start()
    # What `amc cloud serve` adds around the server: the garbage collector's policy.
    collector = gc_policy.start(server.settings.gc_freeze_seconds, server.settings.gc_thaw_seconds)
    served = server.serve_metrics("127.0.0.1:0") if observability == "on" else None
    _ready(f"{server.address} {served.url}" if served is not None else server.address)
    await _until_terminated()
    await server.stop(grace=1)
    if collector is not None:
        await supervised.stop([collector])


class EchoLease(lease_service_pb2_grpc.LeaseServiceServicer):
    """A LeaseService that does nothing but answer: the cost of the transport alone."""

    async def Lease(  # type: ignore[override]  # a streaming handler that writes via context
        self,
        request_iterator: Any,
        context: grpc.aio.ServicerContext[lease_pb.LeaseRequest, lease_pb.LeaseResponse],
    ) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        await context.write(lease_pb.LeaseResponse(welcome=lease_pb.Welcome(host_id="echo")))
        await context.write(
            lease_pb.LeaseResponse(
                assignment=lease_pb.Assignment(
                    task_id="echo-task", attempt=1, lease_id="echo-lease", device_serial="d0"
                )
            )
        )
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            assert isinstance(msg, lease_pb.LeaseRequest)
            if msg.WhichOneof("kind") == "renewal":
                r = msg.renewal
                reply = lease_pb.LeaseResponse(
                    renewed=lease_pb.Renewed(
                        task_id=r.task_id, attempt=r.attempt, lease_id=r.lease_id
                    )
                )
                reply.renewed.lease_expires_at.GetCurrentTime()
                await context.write(reply)


async def serve_echo(pki_dir: Path) -> None:
    """The bare grpc.aio bidirectional stream, same mTLS, same messages, no store.

    It imports only grpc and the generated messages, so its memory is gRPC's own.
    """
    credentials = grpc.ssl_server_credentials(
        [((pki_dir / "server.key").read_bytes(), (pki_dir / "server.pem").read_bytes())],
        root_certificates=(pki_dir / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.aio.server()
    lease_service_pb2_grpc.add_LeaseServiceServicer_to_server(EchoLease(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    _ready(f"127.0.0.1:{port}")
    await _until_terminated()
    await server.stop(1)


class ProgressBody(BaseModel):
    """Progress as the old design's JSON carried it."""

    step_index: int
    step_status: int
    summary: str


class RenewBody(BaseModel):
    """One renewal request of the old design (the host names itself; there was no mTLS)."""

    host_id: str
    task_id: str
    attempt: int
    lease_id: str
    progress: ProgressBody | None = None


def http_app(database_url: str) -> Any:
    """The old design's unary JSON renewal on the same store and the same fenced UPDATE."""
    from fastapi import FastAPI

    from cloud.lease import messages
    from cloud.store import leases
    from cloud.store.database import Store

    store = Store.from_url(database_url)
    app = FastAPI()

    @app.post("/renew")
    async def renew(body: RenewBody) -> dict[str, Any]:
        progress = (
            leases.ProgressIn(
                body.progress.step_index,
                body.progress.step_status,
                leases.truncate_summary(body.progress.summary),
            )
            if body.progress is not None
            else None
        )
        item = leases.RenewalIn(body.host_id, body.task_id, body.attempt, body.lease_id, progress)
        (out,) = await leases.renew_batch(store, [item])
        if out.expires_at is not None:
            return {"renewed": True, "lease_expires_at": out.expires_at.isoformat()}
        reason = 0 if out.revocation is None else int(messages.revoke_reason(out.revocation))
        return {"renewed": False, "reason": reason, "message": out.message}

    return app


async def serve_http(database_url: str) -> None:
    """uvicorn on a pre-bound loopback socket (so port 0 works)."""
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        http_app(database_url), log_level="warning", access_log=False, backlog=4096
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for this
        await asyncio.sleep(0.05)
    _ready(f"127.0.0.1:{port}")
    await _until_terminated()
    server.should_exit = True
    await task


async def serve_adb(phones: int) -> None:
    """Virtual phones behind an adb server, apart from the host so they do not count as its RSS."""
    from host.devices.virtual.adb_server import VirtualAdbServer
    from host.devices.virtual.phone import VirtualPhone

    adb = VirtualAdbServer(VirtualPhone(f"emulator-{5554 + 2 * i}") for i in range(phones))
    port = await adb.start()
    _ready(f"127.0.0.1:{port}")
    await _until_terminated()
    await adb.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a server under benchmark")
    parser.add_argument("kind", choices=["cloud", "echo", "http", "adb"])
    parser.add_argument("--phones", type=int, default=1)
    parser.add_argument("--db", default="")
    parser.add_argument("--pki", default="")
    parser.add_argument("--retention-days", type=float, default=36500.0)
    parser.add_argument("--observability", choices=["default", "on", "off"], default="default")
    parser.add_argument("--listen", default="127.0.0.1:0", help="cloud: the address to serve on")
    parser.add_argument(
        "--pool-size", type=int, default=0, help="cloud: AMC_CLOUD_DATABASE_POOL_SIZE (0: default)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.kind == "cloud":
        asyncio.run(
            serve_cloud(
                args.db,
                Path(args.pki),
                args.retention_days,
                args.observability,
                args.listen,
                args.pool_size,
            )
        )
    elif args.kind == "echo":
        asyncio.run(serve_echo(Path(args.pki)))
    elif args.kind == "adb":
        asyncio.run(serve_adb(args.phones))
    else:
        asyncio.run(serve_http(args.db))


# ---- in the benchmark process ---------------------------------------------------------------


def server_env() -> dict[str, str]:
    """Environment for child processes: the offline planner, no API keys, the repo importable."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and not k.startswith(("AMC_CLOUD_", "AMC_HOST_"))
    }
    env["AMC_PLANNER_PROVIDER"] = "offline"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class ServerProcess:
    """A running `python -m bench.servers` child: its address and pid."""

    def __init__(
        self, proc: subprocess.Popen[str], address: str, log_path: Path, metrics_url: str = ""
    ) -> None:
        self.proc = proc
        self.address = address
        self.log_path = log_path
        #: The /metrics URL when the server serves one (cloud with --observability on).
        self.metrics_url = metrics_url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def server_process(
    kind: str, *args: str, timeout: float = 120.0, cpus: str = ""
) -> Iterator[ServerProcess]:
    """Start a server child, wait for READY, yield it, then SIGTERM it (SIGKILL if it hangs).

    `cpus` (a `taskset -c` list, e.g. "0") pins the server and every thread it starts, so that
    simulated hosts pinned elsewhere do not spend its CPU."""
    log = Path(tempfile.mkstemp(prefix=f"amc-bench-{kind}-", suffix=".log")[1])
    pin = ["taskset", "-c", cpus] if cpus else []
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*pin, sys.executable, "-m", "bench.servers", kind, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=ROOT,
            env=server_env(),
        )
    handle: ServerProcess | None = None
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while handle is None:
            line = proc.stdout.readline()
            if line.startswith("READY "):
                words = line.split()
                handle = ServerProcess(proc, words[1], log, words[2] if len(words) > 2 else "")
            elif not line and proc.poll() is not None:
                raise RuntimeError(
                    f"{kind} server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            elif time.monotonic() > deadline:
                raise TimeoutError(f"{kind} server did not start in {timeout} s")
        yield handle
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def async_server_process(
    kind: str, *args: str, cpus: str = ""
) -> AsyncIterator[ServerProcess]:
    """`server_process` for async callers (the blocking start runs in a thread)."""
    cm = server_process(kind, *args, cpus=cpus)
    handle = await asyncio.to_thread(cm.__enter__)
    try:
        yield handle
    finally:
        await asyncio.to_thread(cm.__exit__, None, None, None)


def utc_now() -> dt.datetime:
    """Aware UTC now (shared by the benchmarks that write rows)."""
    return dt.datetime.now(dt.UTC)


if __name__ == "__main__":
    main()
