"""`PlannerService.Decide` for the cloud transport, wired to the cloud through ports.

The servicer does not import `cloud`: the cloud passes in who the caller is (from its mTLS
certificate), whether a lease is live (`LeaseGate`), and where decisions go (`DecisionSink`, which
assigns the step index atomically per (task, attempt)). Order matters and is the contract:
lease first (no tokens spent and nothing logged for a stale or foreign lease), then sizes, then
the provider, then exactly one appended row. A provider failure logs nothing. The screenshot is
passed to the model call and then dropped: it is never part of what the sink receives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc
from planner.convert import decision_to_proto
from planner.decision import Decision
from planner.errors import PlannerAuthError, PlannerError, PlannerRateLimited
from planner.planner import Planner

MAX_SYSTEM_PROMPT = 64 * 1024
MAX_USER_PROMPT = 512 * 1024
MAX_SCREENSHOT = 8 * 1024 * 1024
# gRPC's default 4 MiB receive limit would reject a legal screenshot before `Decide` could name
# the field: servers and clients of this service set both message limits to this.
MAX_MESSAGE_BYTES = MAX_SCREENSHOT + MAX_USER_PROMPT + MAX_SYSTEM_PROMPT + 1024 * 1024


class LeaseGate(Protocol):
    """Answers whether (task, attempt, lease id) is `host_id`'s live lease right now."""

    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool: ...


class DecisionSink(Protocol):
    """Appends one decision row and returns (decision_id, step_index).

    The step index is 1-based per (task, attempt), assigned atomically with the insert so
    concurrent appends never share or skip an index. The decision's `user_prompt` is already
    masked; a sensitive `input_text` value must be stored via `Decision.masked_arguments()` /
    `planner.convert.decision_to_proto()` (both mask), never from `Decision.arguments`.
    """

    async def append(
        self, host_id: str, task_id: str, attempt: int, decision: Decision
    ) -> tuple[str, int]: ...


HostIdentity = Callable[[grpc.aio.ServicerContext], str]
"""Reads the caller's host id from the grpc.aio ServicerContext (the cloud uses the mTLS SAN)."""


class PlannerServicer(planner_service_pb2_grpc.PlannerServiceServicer):
    """Decide: lease check, size checks, one provider decision, one decision-log row."""

    def __init__(
        self,
        *,
        caller_host_id: HostIdentity,
        lease_gate: LeaseGate,
        sink: DecisionSink,
        planner: Planner,
    ) -> None:
        self._caller_host_id = caller_host_id
        self._leases = lease_gate
        self._sink = sink
        self._planner = planner

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: Any,
    ) -> planner_service_pb2.DecideResponse:
        host_id = self._caller_host_id(context)
        if not host_id:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no host identity on this call")
        live = await self._leases.is_live(
            host_id, request.task_id, request.attempt, request.lease_id
        )
        if not live:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"lease {request.lease_id!r} of task {request.task_id!r} attempt "
                f"{request.attempt} is not a live lease of host {host_id!r}",
            )
        problem = _size_problem(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)

        screen = (request.screen_width, request.screen_height)
        try:
            decision = await self._planner.decide_from_prompts(
                request.system_prompt,
                request.user_prompt,
                element_ids=list(request.element_ids) or None,
                screen_size=screen if screen[0] > 0 and screen[1] > 0 else None,
                screenshot=request.screenshot or None,
            )
        except PlannerRateLimited as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        except PlannerAuthError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        except PlannerError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))

        decision_id, step_index = await self._sink.append(
            host_id, request.task_id, request.attempt, decision
        )
        decision.step_index = step_index
        return planner_service_pb2.DecideResponse(
            decision=decision_to_proto(
                decision,
                decision_id=decision_id,
                host_id=host_id,
                task_id=request.task_id,
                attempt=request.attempt,
                reveal_sensitive=True,
            )
        )


def _size_problem(request: planner_service_pb2.DecideRequest) -> str | None:
    """INVALID_ARGUMENT text naming the field, or None."""
    system_len = len(request.system_prompt.encode("utf-8"))
    user_len = len(request.user_prompt.encode("utf-8"))
    if not request.system_prompt.strip():
        return "system_prompt is empty"
    if system_len > MAX_SYSTEM_PROMPT:
        return f"system_prompt is {system_len} bytes; at most {MAX_SYSTEM_PROMPT}"
    if not request.user_prompt.strip():
        return "user_prompt is empty"
    if user_len > MAX_USER_PROMPT:
        return f"user_prompt is {user_len} bytes; at most {MAX_USER_PROMPT}"
    if len(request.screenshot) > MAX_SCREENSHOT:
        return f"screenshot is {len(request.screenshot)} bytes; at most {MAX_SCREENSHOT}"
    if request.screen_width < 0 or request.screen_height < 0:
        return "screen_width and screen_height must not be negative"
    return None
