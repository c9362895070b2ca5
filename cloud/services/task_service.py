"""TaskService: submit (idempotent, target checked against the fleet), get, list, cancel, and
the lease history of a task. Operators only.

A submission may carry secret parameters: they are validated against the goal's references
(`planner.secret_refs`), sealed with the cloud's key (`cloud.secret_box`) before the store sees
them, and never returned by any RPC. A goal that looks like it holds a credential is queued with
a warning (`cloud.goal_warnings`).
"""

from __future__ import annotations

import dataclasses
import math
import re

import grpc

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import task_service_pb2 as pb
from amc.v1 import task_service_pb2_grpc
from cloud import authz, metrics
from cloud.events import EventBus, RevokeEvent
from cloud.goal_warnings import credential_warnings
from cloud.lease.validate import MAX_ID
from cloud.secret_box import NO_KEY, SecretBox
from cloud.services import durations, targets
from cloud.services.attempts import known_attempt
from cloud.services.decision_log_service import fitting
from cloud.services.status import abort, check_ids
from cloud.settings import CloudSettings
from cloud.store import convert, lease_events, states, tasks, unsettled
from cloud.store.database import Store
from planner import secret_refs
from planner.convert import usage_to_proto

MAX_GOAL = 2000
MAX_REQUEST_ID = 128
MAX_REASON = 500
MAX_ON_BEHALF_OF = 64
MAX_ATTEMPTS = 20
DEFAULT_EVENT_PAGE = 500
MAX_EVENT_PAGE = 1000
_TASK_ID_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")
#: ListTasksRequest.task_ids holds at most this many ids (as ListHostsRequest.host_ids).
MAX_LISTED_IDS = 500
#: Ten years: a task deadline further out is a mistake, and past ~10^9 days datetime overflows.
MAX_TIMEOUT_SECONDS = 10 * 365 * 24 * 3600.0


class TaskServicer(task_service_pb2_grpc.TaskServiceServicer):
    """Operators' view of tasks."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        settings: CloudSettings,
        secrets: SecretBox | None = None,
    ) -> None:
        self._store = store
        self._bus = bus
        self._settings = settings
        self._secrets = secrets

    def _spec(self, r: pb.SubmitTaskRequest) -> tasks.NewTask | str:
        s = self._settings
        if not r.goal.strip():
            return "goal: required"
        if len(r.goal) > MAX_GOAL:
            return f"goal: at most {MAX_GOAL} characters"
        if not 0 <= r.max_attempts <= MAX_ATTEMPTS:
            return f"max_attempts: 0 (default) to {MAX_ATTEMPTS}"
        lease = s.default_lease_seconds
        for name in ("lease_duration", "timeout"):
            if r.HasField(name):
                problem = durations.problem(name, getattr(r, name))
                if problem:
                    return problem
        if r.HasField("lease_duration"):
            lease = durations.seconds(r.lease_duration)
            if not s.min_lease_seconds <= lease <= s.max_lease_seconds:
                return f"lease_duration: {s.min_lease_seconds:g} s to {s.max_lease_seconds:g} s"
        timeout = s.default_timeout_seconds
        if r.HasField("timeout"):
            timeout = durations.seconds(r.timeout)
            if timeout <= 0:
                return "timeout: must be positive"
            if timeout > MAX_TIMEOUT_SECONDS:
                return f"timeout: at most {MAX_TIMEOUT_SECONDS:.0f} s"
        if len(r.client_request_id) > MAX_REQUEST_ID:
            return f"client_request_id: at most {MAX_REQUEST_ID} characters"
        if len(r.target.host_id) > MAX_ID:
            return f"target.host_id: at most {MAX_ID} characters"
        if len(r.target.device_serial) > MAX_ID:
            return f"target.device_serial: at most {MAX_ID} characters"
        budget = r.budget
        if budget.max_tokens < 0:
            return "budget.max_tokens: 0 (the cloud's default) or more"
        if not math.isfinite(budget.max_cost_usd) or budget.max_cost_usd < 0:
            return "budget.max_cost_usd: 0 (the cloud's default) or a positive number of dollars"
        problem = secret_refs.problem(r.goal, r.secrets) or targets.malformed(
            r.target.host_id, r.target.device_serial
        )
        if problem:
            return problem
        return tasks.NewTask(
            goal=r.goal,
            max_attempts=r.max_attempts or s.default_max_attempts,
            lease_seconds=lease,
            timeout_seconds=timeout,
            target_host_id=r.target.host_id or None,
            target_device_serial=r.target.device_serial or None,
            client_request_id=r.client_request_id or None,
            no_replay=r.no_replay,
            max_tokens=budget.max_tokens or s.default_task_max_tokens,
            max_cost_usd=budget.max_cost_usd or s.default_task_max_cost_usd,
        )

    async def SubmitTask(
        self,
        request: pb.SubmitTaskRequest,
        context: grpc.aio.ServicerContext[pb.SubmitTaskRequest, pb.SubmitTaskResponse],
    ) -> pb.SubmitTaskResponse:
        spec = self._spec(request)
        if isinstance(spec, str):
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, spec)
        if request.secrets:
            if self._secrets is None:
                await abort(context, grpc.StatusCode.FAILED_PRECONDITION, NO_KEY)
            box = self._secrets
            sealed = {name: box.seal(value) for name, value in request.secrets.items()}
            spec = dataclasses.replace(spec, sealed_secrets=sealed)
        warnings = credential_warnings(request.goal) + await targets.warnings(
            self._store,
            self._settings.host_heartbeat_seconds,
            request.target.host_id,
            request.target.device_serial,
        )
        if request.validate_only:
            return pb.SubmitTaskResponse(warnings=warnings)
        view, deduplicated = await tasks.submit(self._store, spec)
        metrics.current().submitted(deduplicated)
        if not deduplicated:
            self._bus.tasks_changed([view.task.task_id])
            self._bus.tasks_queued()
        return pb.SubmitTaskResponse(
            task=convert.task(view, with_attempts=True),
            deduplicated=deduplicated,
            warnings=warnings,
        )

    async def GetTask(
        self,
        request: pb.GetTaskRequest,
        context: grpc.aio.ServicerContext[pb.GetTaskRequest, pb.GetTaskResponse],
    ) -> pb.GetTaskResponse:
        if not request.task_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "task_id: required")
        view = await tasks.get(self._store, request.task_id)
        if view is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"task {request.task_id} not found")
        task = convert.task(view, with_attempts=True)
        # The calls whose cost is unknown, beside totals of reported figures (decision 0080).
        per_attempt = await unsettled.by_attempt(self._store, request.task_id)
        for attempt in task.attempts:
            if attempt.attempt in per_attempt:
                calls, at_most = per_attempt[attempt.attempt]
                attempt.unsettled.calls = calls
                attempt.unsettled.at_most.CopyFrom(usage_to_proto(at_most))
        convert.unsettled(task.totals, unsettled.summed(per_attempt))
        return pb.GetTaskResponse(task=task)

    async def ListTasks(
        self,
        request: pb.ListTasksRequest,
        context: grpc.aio.ServicerContext[pb.ListTasksRequest, pb.ListTasksResponse],
    ) -> pb.ListTasksResponse:
        if not 0 <= request.page_size <= 500:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "page_size: 0 to 500")
        # Each status once: the query binds one parameter per status named (PostgreSQL takes
        # at most 65,535), and a client may repeat one as often as a request holds.
        statuses: tuple[str, ...] = ()
        for status in sorted(set(request.statuses)):
            try:
                statuses += (states.from_proto(status),)
            except ValueError:
                await abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, f"statuses: unknown value {status}"
                )
        if len(request.query) > MAX_GOAL:
            # SQLite refuses a LIKE pattern past ~50 KB ("pattern too complex") as an error.
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"query: at most {MAX_GOAL} characters"
            )
        if len(request.host_id) > MAX_ID:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"host_id: at most {MAX_ID} characters"
            )
        prefix = request.task_id_prefix.lower()
        if prefix and not _TASK_ID_PREFIX.match(prefix):
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "task_id_prefix: 1 to 32 hexadecimal digits",
            )
        await check_ids(context, "task_ids", request.task_ids, MAX_LISTED_IDS)
        flt = tasks.TaskFilter(
            statuses,
            request.host_id,
            request.query,
            prefix,
            tuple(sorted(set(request.task_ids))) or None,
        )
        try:
            views, token = await tasks.list_page(
                self._store, flt, request.page_size or 50, request.page_token
            )
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        listed = [convert.task(v, with_attempts=False) for v in views]
        # A task's texts may reach 9 kB (a goal of 2,000 emoji): a page of 500 is cut where it
        # would pass what a default gRPC client reads, as ListHosts' and ListDecisions' are.
        kept = fitting(listed)
        if kept < len(views):
            listed, token = listed[:kept], tasks.encode_cursor(flt, views[kept - 1].task)
        return pb.ListTasksResponse(tasks=listed, next_page_token=token)

    async def CancelTask(
        self,
        request: pb.CancelTaskRequest,
        context: grpc.aio.ServicerContext[pb.CancelTaskRequest, pb.CancelTaskResponse],
    ) -> pb.CancelTaskResponse:
        if not request.task_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "task_id: required")
        if len(request.reason) > MAX_REASON:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"reason: at most {MAX_REASON} characters",
            )
        person = request.on_behalf_of
        if len(person) > MAX_ON_BEHALF_OF or not person.isprintable():
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"on_behalf_of: at most {MAX_ON_BEHALF_OF} printable characters",
            )
        caller = authz.caller().name
        operator = f"{person} via {caller}" if person else caller
        out = await tasks.cancel(self._store, request.task_id, request.reason, operator)
        if out.view is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"task {request.task_id} not found")
        if out.already_ended:
            # In the words operators read everywhere else ("cancelled"), not the enum's name.
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"task {request.task_id} already ended: {out.view.task.status.lower()}",
            )
        if out.revoke is not None:
            self._bus.revoke(
                RevokeEvent(
                    out.revoke.host_id,
                    out.revoke.task_id,
                    out.revoke.attempt,
                    out.revoke.lease_id,
                    lease_pb.REVOKE_REASON_CANCELLED,
                    out.view.task.cancel_reason or "cancelled",
                    task_status=out.view.task.status,
                )
            )
        self._bus.tasks_changed([request.task_id])
        return pb.CancelTaskResponse(task=convert.task(out.view, with_attempts=True))

    async def ListTaskEvents(
        self,
        request: pb.ListTaskEventsRequest,
        context: grpc.aio.ServicerContext[pb.ListTaskEventsRequest, pb.ListTaskEventsResponse],
    ) -> pb.ListTaskEventsResponse:
        if not request.task_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "task_id: required")
        if request.attempt < 0:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "attempt: must be >= 0")
        if not 0 <= request.page_size <= MAX_EVENT_PAGE:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"page_size: 0 to {MAX_EVENT_PAGE}"
            )
        await known_attempt(context, self._store, request.task_id, request.attempt)
        try:
            rows, token = await lease_events.list_page(
                self._store,
                request.task_id,
                request.attempt,
                request.page_size or DEFAULT_EVENT_PAGE,
                request.page_token,
            )
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        return pb.ListTaskEventsResponse(
            events=[convert.lease_event(r) for r in rows], next_page_token=token
        )
