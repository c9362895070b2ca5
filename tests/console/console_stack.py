"""The stack the console tests run against: a real cloud, the real gateway, simulated hosts.

The cloud (grpc.aio) runs on an event loop in its own thread and the gateway under a real uvicorn
server in another, so synchronous tests (httpx, Playwright's sync API) can drive both. Hosts are
simulated with the *synchronous* gRPC client over mTLS with a host certificate: to the cloud a
host is one LeaseService stream (hello, renewals carrying progress, results) plus
PlannerService.Decide calls, so simulating exactly that keeps the console tests independent of
the agent loop and of phones.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import uvicorn
from fastapi import FastAPI

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    lease_service_pb2,
    lease_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from cloud import pki as cloud_pki
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from console.gateway import create_app
from console.settings import ConsoleSettings
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from planner.scene import Bounds, Element, Scene
from tests.support.loop_thread import LoopThread

T = TypeVar("T")
WAIT_S = 20.0

#: The console's login and API token in every test.
ADMIN = "operator"
PASSWORD = "correct horse battery staple"
API_TOKEN = "test-api-token-0123456789abcdef"
#: The console's viewer login and token (read-only) in every test.
VIEWER = "watcher"
VIEWER_PASSWORD = "look but do not touch"
VIEWER_TOKEN = "test-viewer-token-0123456789abcdef"
#: The fleet page's largest page: the tests' shared cloud holds every test's hosts, and the
#: fleet lists them by id, so a test's own host is on the first page of 50 only by chance.
WHOLE_FLEET = 500


class UvicornThread:
    """A real uvicorn server on 127.0.0.1 port 0 in a thread (or `server`, built elsewhere)."""

    def __init__(self, app: FastAPI | None = None, server: uvicorn.Server | None = None) -> None:
        if server is None:
            assert app is not None, "an app or a server"
            config = uvicorn.Config(
                app,
                host="127.0.0.1",
                port=0,
                log_level="warning",
                timeout_graceful_shutdown=1,
                lifespan="on",
            )
            server = uvicorn.Server(config)
        self.server = server
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def start(self) -> str:
        """Start serving; returns the base URL (https when the server has a certificate)."""
        self._thread.start()
        while not self.server.started and self._thread.is_alive():
            time.sleep(0.02)
        if not self.server.started:
            raise RuntimeError("uvicorn did not start")
        port = self.server.servers[0].sockets[0].getsockname()[1]
        scheme = "https" if self.server.config.ssl_certfile else "http"
        return f"{scheme}://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(WAIT_S)


@contextlib.contextmanager
def cloud_of_its_own(
    tmp_path: Path, pki_dir: Path, name: str
) -> Iterator[tuple[LoopThread, CloudServer, str]]:
    """A cloud on a SQLite file of its own (in a loop thread: its loop, the server) and a
    gateway over it (its base URL), for a test whose rows would crowd the shared cloud's
    listings, or that needs a cloud with none."""
    loop = LoopThread(f"{name}-cloud")
    server = loop.run(
        build_server(
            CloudSettings(
                database_url=f"sqlite+aiosqlite:///{tmp_path / f'{name}.sqlite3'}",
                listen_address="127.0.0.1:0",
                pki_dir=pki_dir,
            )
        )
    )
    loop.run(server.start())
    gateway = UvicornThread(
        create_app(
            ConsoleSettings(
                cloud_address=server.address,
                certs_dir=pki_dir,
                operator_name="console",
                admin_username=ADMIN,
                admin_password=PASSWORD,
                api_token=API_TOKEN,
                session_secret="test-session-secret-0123456789",
            )
        )
    )
    try:
        yield loop, server, gateway.start()
    finally:
        gateway.stop()
        loop.run(server.stop(0))
        loop.stop()


def fail_after_first_change(app: FastAPI) -> None:
    """Make the served gateway's live task streams fail after their first real change.

    A failure of the gateway's own code mid-stream cannot be provoked from outside (it would
    be a bug), so the cloud client's watch is wrapped: the changes are the real cloud's."""
    cloud = app.state.cloud
    real_watch = cloud.watch

    def failing_watch(
        task_id: str = "", *, thinking: bool = False, snapshot: bool = True, watching: Any = None
    ) -> Any:
        async def changes() -> Any:
            async for change in real_watch(
                task_id, thinking=thinking, snapshot=snapshot, watching=watching
            ):
                yield change
                raise RuntimeError("a bug after the first change")

        return changes()

    cloud.watch = failing_watch


def channel_credentials(pki: Path, cert_stem: str) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / f"{cert_stem}.key").read_bytes(),
        certificate_chain=(pki / f"{cert_stem}.pem").read_bytes(),
    )


class Operator:
    """Synchronous operator calls (with an operator certificate) used to set up tests."""

    def __init__(self, address: str, pki: Path, name: str) -> None:
        self.channel = grpc.secure_channel(address, channel_credentials(pki, f"operator-{name}"))
        self.tasks = task_service_pb2_grpc.TaskServiceStub(self.channel)

    def submit(self, goal: str, *, host_id: str = "", max_attempts: int = 0) -> types_pb2.Task:
        response: task_service_pb2.SubmitTaskResponse = self.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal=goal,
                target=types_pb2.TaskTarget(host_id=host_id),
                max_attempts=max_attempts,
            ),
            timeout=WAIT_S,
        )
        return response.task

    def get(self, task_id: str) -> types_pb2.Task:
        response: task_service_pb2.GetTaskResponse = self.tasks.GetTask(
            task_service_pb2.GetTaskRequest(task_id=task_id), timeout=WAIT_S
        )
        return response.task

    def close(self) -> None:
        self.channel.close()


class SimHost:
    """A host as the cloud sees it: one Lease stream, renewals with progress, results, Decide."""

    def __init__(
        self,
        address: str,
        pki: Path,
        host_id: str,
        *,
        transport: types_pb2.PlannerTransport.ValueType = types_pb2.PLANNER_TRANSPORT_CLOUD,
        serials: tuple[str, ...] = ("emu-1",),
    ) -> None:
        self.host_id = host_id
        self.transport = transport
        self.serials = serials
        self.responses: queue.Queue[lease_service_pb2.LeaseResponse | BaseException] = queue.Queue()
        self._requests: queue.Queue[lease_service_pb2.LeaseRequest | None] = queue.Queue()
        self.channel = grpc.secure_channel(address, channel_credentials(pki, f"host-{host_id}"))
        self._lease = lease_service_pb2_grpc.LeaseServiceStub(self.channel)
        self._planner = planner_service_pb2_grpc.PlannerServiceStub(self.channel)
        self._log = decision_log_service_pb2_grpc.DecisionLogServiceStub(self.channel)
        self._call: Any = None
        self._reader: threading.Thread | None = None

    def _outgoing(self) -> Iterator[lease_service_pb2.LeaseRequest]:
        while (request := self._requests.get()) is not None:
            yield request

    def _read(self) -> None:
        try:
            for response in self._call:
                self.responses.put(response)
        except grpc.RpcError as error:
            self.responses.put(error)

    def connect(self, reason: str = "") -> lease_service_pb2.Welcome:
        """Open the stream with a hello announcing the phones (each with this `reason`, the
        words a host gives for a phone it cannot use); returns the Welcome."""
        self._call = self._lease.Lease(self._outgoing())
        self._reader = threading.Thread(target=self._read, name=f"sim-{self.host_id}", daemon=True)
        self._reader.start()
        devices = [
            types_pb2.Device(
                serial=s,
                model="amc virtual phone",
                state=types_pb2.DEVICE_STATE_ONLINE,
                reason=reason,
            )
            for s in self.serials
        ]
        hello = lease_service_pb2.HostHello(
            devices=devices, agent_version="sim-1", planner_transport=self.transport
        )
        self.send(lease_service_pb2.LeaseRequest(hello=hello))
        return self.expect("welcome").welcome

    def send(self, request: lease_service_pb2.LeaseRequest) -> None:
        self._requests.put(request)

    def expect(self, kind: str, timeout: float = WAIT_S) -> lease_service_pb2.LeaseResponse:
        """The next response of this kind (others in between are skipped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                item = self.responses.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            if item.WhichOneof("kind") == kind:
                return item
            if item.WhichOneof("kind") == "rejected":
                raise AssertionError(f"the cloud rejected a message: {item.rejected}")
        raise TimeoutError(f"no {kind} from the cloud within {timeout}s")

    def assignment(self) -> lease_service_pb2.Assignment:
        return self.expect("assignment").assignment

    def renew(
        self,
        a: lease_service_pb2.Assignment,
        step: int,
        step_status: types_pb2.StepStatus.ValueType,
        summary: str,
    ) -> None:
        """Renew the lease carrying new progress; returns once the cloud accepted it."""
        progress = types_pb2.Progress(step_index=step, step_status=step_status, summary=summary)
        renewal = lease_service_pb2.LeaseRenewal(
            task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, progress=progress
        )
        self.send(lease_service_pb2.LeaseRequest(renewal=renewal))
        self.expect("renewed")

    def finish(
        self, a: lease_service_pb2.Assignment, status: types_pb2.TaskStatus.ValueType, summary: str
    ) -> None:
        """Report the attempt's end; returns once the cloud acknowledged it."""
        result = lease_service_pb2.TaskResult(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            status=status,
            summary=summary,
        )
        self.send(lease_service_pb2.LeaseRequest(result=result))
        self.expect("result_ack")

    def decide(self, a: lease_service_pb2.Assignment, goal: str) -> types_pb2.Decision:
        """One planning call on the cloud transport, its prompt built by the planner's own
        prompt builder over a small Settings screen; the cloud logs the decision."""
        scene = Scene(
            elements=[
                Element("e1", Bounds(0, 200, 1080, 320), text="Network & internet", clickable=True),
                Element("e2", Bounds(0, 320, 1080, 440), text="Display", clickable=True),
            ],
            package="com.android.settings",
            page_title="Settings",
            screen_width=1080,
            screen_height=2400,
        )
        response: planner_service_pb2.DecideResponse = self._planner.Decide(
            planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                system_prompt=SYSTEM_PROMPT,
                user_prompt=build_user_prompt(goal, scene),
                element_ids=["e1", "e2"],
                screen_width=1080,
                screen_height=2400,
            ),
            timeout=WAIT_S,
        )
        return response.decision

    def ship(
        self, a: lease_service_pb2.Assignment, host_decision_id: str, usage: types_pb2.Usage
    ) -> None:
        """Ship one decision made on the direct transport (a tap that cost `usage`); returns
        once the cloud logged it."""
        action = types_pb2.Action(purpose="open it", expected_outcome="it opens")
        action.tap.element_id = "e1"
        entry = decision_log_service_pb2.ShippedDecision(
            host_decision_id=host_decision_id,
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            decision=types_pb2.Decision(
                tool_name="tap",
                action=action,
                provider="anthropic",
                model="claude-test",
                system_prompt="s",
                user_prompt="u",
                purpose="open it",
                expected_outcome="it opens",
                usage=usage,
            ),
        )
        self._log.ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(entries=[entry]), timeout=WAIT_S
        )

    def ship_request(self, request: decision_log_service_pb2.ShipDecisionsRequest) -> None:
        """Ship what a direct-transport host's outbox holds; returns once the cloud recorded it."""
        self._log.ShipDecisions(request, timeout=WAIT_S)

    def close(self) -> None:
        self._requests.put(None)
        if self._call is not None:
            self._call.cancel()
        self.channel.close()
        if self._reader is not None:
            self._reader.join(WAIT_S)


HostFactory = Callable[..., SimHost]
"""The `make_host` fixture: connect a simulated host (optionally with a planner transport)."""


@dataclass
class Cloud:
    """The running cloud: its address, PKI folder, server object and the loop it runs on."""

    address: str
    pki: Path
    server: CloudServer
    loop: LoopThread

    def host(self, host_id: str) -> SimHost:
        """A simulated host with this id (and a certificate for it), not yet connected: for a
        test that needs ids in a known order."""
        cloud_pki.write_host_cert(self.pki, host_id)
        return SimHost(self.address, self.pki, host_id)
