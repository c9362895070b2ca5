"""The gateway's gRPC connection to the cloud, under its own operator certificate.

One channel, one stub per service the console reads or drives. Every unary call carries a
deadline so a stuck cloud turns into a 503/504 page instead of a hung browser tab.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Literal, NamedTuple, Protocol, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    flow_service_pb2,
    flow_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from cloud import cert_validity
from console.client import hosts_kept, list_hosts_request, secure_channel, watch_progress
from console.formatting import enum_word
from console.gateway import errors

#: Upper bound of decisions the detail view loads for one task (an export reads them all).
MAX_DECISIONS = 5_000
#: Decisions per ListDecisions page, without and with their screens (pages of screens stay a
#: few MB).
DECISION_PAGE = 500
OBSERVATION_PAGE = 100


class LogHead(NamedTuple):
    """The first decisions of a task's log (`CloudClient.decision_log_head`)."""

    decisions: list[types_pb2.Decision]
    failed_calls: list[decision_log_service_pb2.FailedCalls]
    pruned: decision_log_service_pb2.PrunedRecord | None
    #: The ListDecisions token of the decisions after these; empty when these are all.
    next_page_token: str


class _Page(Protocol):
    """A listing's answer: its next page's token, empty on the last page."""

    @property
    def next_page_token(self) -> str: ...


_PageT = TypeVar("_PageT", bound=_Page)
_T = TypeVar("_T")


async def _every_page(
    read: Callable[[str], Awaitable[_PageT]],
    items: Callable[[_PageT], Iterable[_T]],
    most: int | None = None,
) -> list[_T]:
    """The items of every page of a listing, `read(token)` a page at a time (the first with no
    token) until one says it is the last; with `most`, no page is asked for once that many are
    read (the last page read may pass it)."""
    found: list[_T] = []
    token = ""
    while most is None or len(found) < most:
        page = await read(token)
        found.extend(items(page))
        token = page.next_page_token
        if not token:
            break
    return found


def _duration(seconds: float | None) -> Duration | None:
    if seconds is None:
        return None
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def health_word(status: int) -> str:
    """A health answer's status as its name ("SERVING"); a number this gateway's protos do not
    know (a newer cloud's) reads "UNKNOWN (99)": `Name` raised ValueError, and /healthz and
    /readyz answered 500 instead of saying the cloud is not (known to be) serving."""
    return enum_word(health_pb2.HealthCheckResponse.ServingStatus, status, "").upper()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


class CloudClient:
    """Typed calls the console makes; raises `grpc.aio.AioRpcError` as the cloud answers."""

    def __init__(
        self,
        address: str,
        *,
        ca: Path,
        cert: Path,
        key: Path,
        server_name: str | None = None,
        timeout_s: float = 10.0,
        reconnect_initial_s: float = 0.5,
        reconnect_max_s: float = 5.0,
    ) -> None:
        #: The files the channel presents and checks, as read now (`certificate_problem`).
        self._pem = (cert, ca, _read(cert), _read(ca))
        self._channel = secure_channel(
            address,
            ca=ca,
            cert=cert,
            key=key,
            server_name=server_name,
            reconnect_initial_s=reconnect_initial_s,
            reconnect_max_s=reconnect_max_s,
        )
        self._timeout = timeout_s
        self._tasks = task_service_pb2_grpc.TaskServiceStub(self._channel)
        self._progress = progress_service_pb2_grpc.ProgressServiceStub(self._channel)
        self._fleet = fleet_service_pb2_grpc.FleetServiceStub(self._channel)
        self._decisions = decision_log_service_pb2_grpc.DecisionLogServiceStub(self._channel)
        self._flows = flow_service_pb2_grpc.FlowServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._artifacts = artifact_service_pb2_grpc.ArtifactServiceStub(self._channel)

    def certificate_problem(self) -> str:
        """Why the cloud would refuse the operator certificate this console's channel presents
        (expired, not valid yet; the fleet CA expired) now; "" when it would not, or when the
        files could not be read (the channel says so). The certificate as read when the
        channel opened (parsed once: `cert_validity.certificate`): a new file on disk is not
        presented until the console restarts."""
        cert, ca, cert_pem, ca_pem = self._pem
        if cert_pem is None or ca_pem is None:
            return ""
        try:
            cert_validity.check_read(cert_pem, ca_pem, cert, ca, "operator certificate")
        except cert_validity.CertificateInvalid as exc:
            return str(exc)
        return ""

    def describe(self, error: grpc.aio.AioRpcError) -> tuple[int, str, str]:
        """`errors.describe` of a failed call of this client's: an UNAVAILABLE names this
        console's own certificate when the cloud refuses it (`certificate_problem`)."""
        return errors.describe(error, self.certificate_problem)

    async def health(self, timeout_s: float = 2.0) -> str:
        """The cloud's gRPC health ("SERVING", "NOT_SERVING", ...) or the failure's code name."""
        try:
            response = await self._health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as error:
            code: grpc.StatusCode = error.code()
            return str(code.name)
        return health_word(response.status)

    async def close(self) -> None:
        """Close the channel; open watch streams end with CANCELLED."""
        await self._channel.close()

    async def list_tasks(
        self,
        *,
        statuses: list[int],
        host_id: str,
        query: str,
        page_size: int,
        page_token: str,
        task_id_prefix: str = "",
    ) -> task_service_pb2.ListTasksResponse:
        request = task_service_pb2.ListTasksRequest(
            page_size=page_size,
            page_token=page_token,
            statuses=statuses,  # type: ignore[arg-type]
            host_id=host_id,
            query=query,
            task_id_prefix=task_id_prefix,
        )
        response: task_service_pb2.ListTasksResponse = await self._tasks.ListTasks(
            request, timeout=self._timeout
        )
        return response

    async def get_task(self, task_id: str) -> types_pb2.Task:
        response: task_service_pb2.GetTaskResponse = await self._tasks.GetTask(
            task_service_pb2.GetTaskRequest(task_id=task_id), timeout=self._timeout
        )
        return response.task

    async def submit_task(
        self,
        *,
        goal: str,
        host_id: str,
        device_serial: str,
        max_attempts: int,
        lease_duration_s: float | None,
        timeout_s: float | None,
        client_request_id: str,
        secrets: dict[str, str] | None = None,
        no_replay: bool = False,
        validate_only: bool = False,
        budget: types_pb2.TaskBudget | None = None,
    ) -> task_service_pb2.SubmitTaskResponse:
        request = task_service_pb2.SubmitTaskRequest(
            goal=goal,
            target=types_pb2.TaskTarget(host_id=host_id, device_serial=device_serial),
            max_attempts=max_attempts,
            lease_duration=_duration(lease_duration_s),
            timeout=_duration(timeout_s),
            client_request_id=client_request_id,
            secrets=secrets or {},
            no_replay=no_replay,
            validate_only=validate_only,
            budget=budget,
        )
        response: task_service_pb2.SubmitTaskResponse = await self._tasks.SubmitTask(
            request, timeout=self._timeout
        )
        return response

    async def list_flows(
        self,
        *,
        statuses: list[types_pb2.FlowStatus.ValueType] | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> flow_service_pb2.ListFlowsResponse:
        response: flow_service_pb2.ListFlowsResponse = await self._flows.ListFlows(
            flow_service_pb2.ListFlowsRequest(
                statuses=statuses or [], page_size=page_size, page_token=page_token
            ),
            timeout=self._timeout,
        )
        return response

    async def get_flow(self, flow_id: str) -> types_pb2.Flow:
        response: flow_service_pb2.GetFlowResponse = await self._flows.GetFlow(
            flow_service_pb2.GetFlowRequest(flow_id=flow_id), timeout=self._timeout
        )
        return response.flow

    async def set_flow_status(self, flow_id: str, active: bool, reason: str) -> types_pb2.Flow:
        status = types_pb2.FLOW_STATUS_ACTIVE if active else types_pb2.FLOW_STATUS_DISABLED
        response: flow_service_pb2.SetFlowStatusResponse = await self._flows.SetFlowStatus(
            flow_service_pb2.SetFlowStatusRequest(flow_id=flow_id, status=status, reason=reason),
            timeout=self._timeout,
        )
        return response.flow

    async def events(self, task_id: str, attempt: int = 0) -> list[task_service_pb2.LeaseEvent]:
        """A task's whole lease history (or one attempt's), oldest first (every page)."""
        events: list[task_service_pb2.LeaseEvent] = await _every_page(
            lambda token: self._tasks.ListTaskEvents(
                task_service_pb2.ListTaskEventsRequest(
                    task_id=task_id, attempt=attempt, page_size=1000, page_token=token
                ),
                timeout=self._timeout,
            ),
            lambda page: page.events,
        )
        return events

    async def cancel_task(
        self, task_id: str, reason: str, on_behalf_of: str = ""
    ) -> types_pb2.Task:
        """Cancel for `on_behalf_of` (the logged-in person; the cloud records "<person> via
        <this gateway's operator name>")."""
        response: task_service_pb2.CancelTaskResponse = await self._tasks.CancelTask(
            task_service_pb2.CancelTaskRequest(
                task_id=task_id, reason=reason, on_behalf_of=on_behalf_of
            ),
            timeout=self._timeout,
        )
        return response.task

    async def hosts_page(
        self,
        *,
        page_size: int,
        page_token: str = "",
        connection: fleet_service_pb2.HostConnection.ValueType = (
            fleet_service_pb2.HOST_CONNECTION_UNSPECIFIED
        ),
        query: str = "",
        host_ids: list[str] | None = None,
    ) -> fleet_service_pb2.ListHostsResponse:
        """One page of hosts (by id; those whose id contains `query`, or those of `host_ids`;
        connected or not, as `connection` says) and whether the cloud dispatches."""
        # Said in a form an older cloud, which ignores `connection`, filters by too.
        response: fleet_service_pb2.ListHostsResponse = await self._fleet.ListHosts(
            list_hosts_request(
                connection,
                page_size=page_size,
                page_token=page_token,
                host_query=query,
                host_ids=host_ids or [],
            ),
            timeout=self._timeout,
        )
        return hosts_kept(response, connection)

    async def spend(
        self, since_day: str = "", until_day: str = ""
    ) -> fleet_service_pb2.GetSpendResponse:
        """The fleet's spending per day, host and model, and today's against the daily caps."""
        response: fleet_service_pb2.GetSpendResponse = await self._fleet.GetSpend(
            fleet_service_pb2.GetSpendRequest(since_day=since_day, until_day=until_day),
            timeout=self._timeout,
        )
        return response

    async def list_decisions(
        self,
        task_id: str,
        *,
        attempt: int,
        page_size: int,
        page_token: str,
        include_observation: bool = False,
        after_step: int = 0,
        newest_first: bool = False,
        count_steps: bool = False,
    ) -> decision_log_service_pb2.ListDecisionsResponse:
        response: decision_log_service_pb2.ListDecisionsResponse = (
            await self._decisions.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(
                    task_id=task_id,
                    attempt=attempt,
                    page_size=page_size,
                    page_token=page_token,
                    include_observation=include_observation,
                    after_step=after_step,
                    newest_first=newest_first,
                    count_steps=count_steps,
                ),
                timeout=self._timeout,
            )
        )
        return response

    async def decision_log(
        self,
        task_id: str,
        *,
        include_observation: bool = False,
        attempt: int = 0,
        after_step: int = 0,
        limit: int | None = MAX_DECISIONS,
    ) -> tuple[
        list[types_pb2.Decision],
        list[decision_log_service_pb2.FailedCalls],
        decision_log_service_pb2.PrunedRecord | None,
    ]:
        """Every decision of a task (up to `limit`, None: all), following the page tokens, what
        its failed decisions' answered calls cost per attempt (billed, though no decision is
        logged for them), and what the cloud's retention deleted of the log (None: nothing);
        with `include_observation` each decision carries the screen it was made on (exports
        want it). With `attempt`, only that attempt's steps after `after_step`."""
        read = await self.decision_log_head(
            task_id,
            include_observation=include_observation,
            attempt=attempt,
            after_step=after_step,
            limit=limit,
        )
        return read.decisions, read.failed_calls, read.pruned

    async def decision_log_head(
        self,
        task_id: str,
        *,
        include_observation: bool = False,
        attempt: int = 0,
        after_step: int = 0,
        limit: int | None = MAX_DECISIONS,
    ) -> LogHead:
        """`decision_log`, and where the log goes on past `limit` (`LogHead.next_page_token`):
        a reader shown the first `limit` decisions of a longer log was not told that any were
        left out. Never more than `limit`: the page that reaches it asks for just the rest."""
        decisions: list[types_pb2.Decision] = []
        failed: list[decision_log_service_pb2.FailedCalls] = []
        pruned: decision_log_service_pb2.PrunedRecord | None = None
        token = ""
        size = OBSERVATION_PAGE if include_observation else DECISION_PAGE
        while limit is None or len(decisions) < limit:
            page = await self.list_decisions(
                task_id,
                attempt=attempt,
                page_size=size if limit is None else min(size, limit - len(decisions)),
                page_token=token,
                include_observation=include_observation,
                after_step=after_step,
            )
            decisions.extend(page.decisions)
            failed = list(page.failed_calls)  # every page has the same, and the same record
            pruned = page.pruned if page.HasField("pruned") else None
            token = page.next_page_token
            if not token:
                break
        return LogHead(decisions, failed, pruned, token)

    async def conversation(
        self, task_id: str, attempt: int
    ) -> list[decision_log_service_pb2.ConversationItem]:
        """Every item of a session-mode attempt's conversation (empty for compact mode). An
        attempt the task never had is the cloud's NOT_FOUND ("task X has no attempt 7 (it has
        1)"), a 404 here: an empty answer would read as a record (compact mode, pruned)."""
        items: list[decision_log_service_pb2.ConversationItem] = await _every_page(
            lambda token: self._decisions.GetConversation(
                decision_log_service_pb2.GetConversationRequest(
                    task_id=task_id, attempt=attempt, page_size=500, page_token=token
                ),
                timeout=self._timeout,
            ),
            lambda page: page.items,
        )
        return items

    async def screenshots(
        self, task_id: str, attempt: int = 0, after_step: int = 0
    ) -> list[artifact_service_pb2.StepScreenshot]:
        """Every step screenshot of a task (or of one attempt, past `after_step` of it; metadata
        only), following the page tokens."""
        shots: list[artifact_service_pb2.StepScreenshot] = await _every_page(
            lambda token: self._artifacts.ListStepScreenshots(
                artifact_service_pb2.ListStepScreenshotsRequest(
                    task_id=task_id,
                    attempt=attempt,
                    page_size=1000,
                    page_token=token,
                    after_step=after_step,
                ),
                timeout=self._timeout,
            ),
            lambda page: page.screenshots,
            most=2 * MAX_DECISIONS,
        )
        return shots

    async def screenshot(
        self, task_id: str, attempt: int, step_index: int, which: Literal["before", "after"]
    ) -> bytes | None:
        """One step screenshot's bytes from the cloud's artifact store, None when it has none
        (an export's `ScreenshotSource`)."""
        phase = (
            artifact_service_pb2.SCREENSHOT_PHASE_BEFORE
            if which == "before"
            else artifact_service_pb2.SCREENSHOT_PHASE_AFTER
        )
        parts: list[bytes] = []
        try:
            async for chunk in self.screenshot_chunks(task_id, attempt, step_index, phase):
                parts.append(chunk.data)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return b"".join(parts)

    async def screenshot_chunks(
        self, task_id: str, attempt: int, step_index: int, phase: int
    ) -> AsyncGenerator[artifact_service_pb2.GetStepScreenshotResponse, None]:
        """One screenshot's chunks (the first carries its metadata); closing the iterator
        cancels the call."""
        call = self._artifacts.GetStepScreenshot(
            artifact_service_pb2.GetStepScreenshotRequest(
                task_id=task_id,
                attempt=attempt,
                step_index=step_index,
                phase=phase,  # type: ignore[arg-type]
            ),
            timeout=self._timeout * 3,
        )
        try:
            async for chunk in call:
                yield chunk
        finally:
            call.cancel()

    async def get_decision(self, decision_id: str) -> types_pb2.Decision:
        response: decision_log_service_pb2.GetDecisionResponse = await self._decisions.GetDecision(
            decision_log_service_pb2.GetDecisionRequest(decision_id=decision_id),
            timeout=self._timeout,
        )
        return response.decision

    async def watch_hosts(
        self,
        watching: Callable[[], object] | None = None,
        scope: fleet_service_pb2.WatchHostsRequest | None = None,
    ) -> AsyncIterator[fleet_service_pb2.WatchHostsResponse]:
        """Live host changes: the snapshot, its end marker, then one message per changed host;
        `watching` as for `watch` (the cloud's headers come with the snapshot it reads once it
        watches). `scope`: the fleet page's (connection, page size, page token); none: every
        host.

        No deadline, like `watch`; closing the iterator cancels the call.
        """
        call = self._fleet.WatchHosts(scope or fleet_service_pb2.WatchHostsRequest())
        try:
            if watching is not None:
                await call.initial_metadata()
                watching()
            async for message in call:
                yield message
        finally:
            call.cancel()

    def watch(
        self,
        task_id: str = "",
        *,
        thinking: bool = False,
        snapshot: bool = True,
        watching: Callable[[], object] | None = None,
    ) -> AsyncIterator[progress_service_pb2.WatchProgressResponse]:
        """Live task changes (snapshot first, unless not `snapshot`), and with `thinking` the
        model's live thinking; ends when a watched single task ends. `watching` is called once
        the cloud watches.

        No deadline: the stream lives as long as the browser listens. Closing the iterator
        cancels the call (`console.client.watch_progress`: batched, one task per message).
        """
        return watch_progress(
            self._progress, task_id, thinking=thinking, snapshot=snapshot, watching=watching
        )
