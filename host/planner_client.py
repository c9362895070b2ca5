"""Planning for the agent loop: the planner library in-process, or the cloud's Decide service.

Both transports build the same prompts (`planner.prompts`), so a decision logged by the cloud
is exactly what an in-process planner would have asked. In session mode the cloud keeps the
conversation and the host sends only its step of it (`CloudSessionPlanner`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import grpc

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc
from planner.convert import decision_from_proto
from planner.decision import Decision
from planner.history import WorldEvent
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from planner.scene import Scene
from planner.service import MAX_TOOL_OUTPUT
from planner.session.step_planner import outcome_of, scene_json


class StepPlanner(Protocol):
    """What the agent loop needs from a planner (the library's `Planner` fits as is)."""

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision: ...


class CloudPlanError(RuntimeError):
    """The cloud refused or failed a Decide call. `lease_lost` when the lease is not live."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def lease_lost(self) -> bool:
        return bool(self.code == grpc.StatusCode.FAILED_PRECONDITION)


class _AttemptPlanner:
    """What both cloud planners share: one attempt's identity on the Decide call, its deadline
    and its errors."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        task_id: str,
        attempt: int,
        lease_id: str,
        timeout_s: float = 120.0,
    ) -> None:
        self._stub = planner_service_pb2_grpc.PlannerServiceStub(channel)
        self.task_id = task_id
        self.attempt = attempt
        self.lease_id = lease_id
        self.timeout_s = timeout_s

    def _request(self, scene: Scene, **fields: Any) -> planner_service_pb2.DecideRequest:
        return planner_service_pb2.DecideRequest(
            task_id=self.task_id,
            attempt=self.attempt,
            lease_id=self.lease_id,
            element_ids=[e.element_id for e in scene.elements],
            screen_width=scene.screen_width,
            screen_height=scene.screen_height,
            **fields,
        )

    async def _call(
        self, request: planner_service_pb2.DecideRequest
    ) -> planner_service_pb2.DecideResponse:
        try:
            response: planner_service_pb2.DecideResponse = await self._stub.Decide(
                request, timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            message = f"cloud planner: {exc.code().name}: {exc.details()}"
            raise CloudPlanError(message, exc.code()) from exc
        return response


class CloudPlanner(_AttemptPlanner):
    """`StepPlanner` over `PlannerService.Decide` for one attempt (its task, attempt and lease)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        task_id: str,
        attempt: int,
        lease_id: str,
        history_window: int = 20,
        send_screenshot: bool = False,
        timeout_s: float = 120.0,
    ) -> None:
        super().__init__(channel, task_id, attempt, lease_id, timeout_s)
        self.history_window = history_window
        self.send_screenshot = send_screenshot

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        user_prompt = build_user_prompt(goal, scene, history, history_window=self.history_window)
        request = self._request(scene, system_prompt=SYSTEM_PROMPT, user_prompt=user_prompt)
        if screenshot and self.send_screenshot:
            request.screenshot = screenshot
        response = await self._call(request)
        decision = decision_from_proto(response.decision)
        # What was sent is what we built, whatever the cloud echoes.
        decision.system_prompt = SYSTEM_PROMPT
        decision.user_prompt = user_prompt
        return decision


MAX_PAGE_CHARS = 256  # the page name only labels a condensed observation
TRUNCATED = "\n… (truncated to fit the Decide request)"


def _fit(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes with a note, so a huge UI tree answers the
    model with most of itself instead of failing the request (INVALID_ARGUMENT)."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    room = limit - len(TRUNCATED.encode("utf-8"))
    return raw[:room].decode("utf-8", errors="ignore") + TRUNCATED


class CloudSessionPlanner(_AttemptPlanner):
    """Session mode over `PlannerService.Decide`: the cloud keeps the conversation.

    The host sends what only it knows — the goal, the current scene, and the outcome of the
    call it last executed — and the cloud continues the stored conversation exactly as the
    direct transport would (`planner.session.step_planner.continue_session`). Nothing of the
    conversation is kept here, so a new attempt on any host continues it. No screenshots:
    a conversation is stored, and screenshots never reach the cloud database.
    """

    _last_call: tuple[str, str] | None = None  # (call id, tool) this host last executed

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        step = planner_service_pb2.SessionStep(
            goal=goal, scene_json=scene_json(scene), page=(scene.page or "")[:MAX_PAGE_CHARS]
        )
        if self._last_call is not None:
            outcome = outcome_of(*self._last_call, scene, history)
            if outcome is not None:
                step.previous_outcome.CopyFrom(
                    planner_service_pb2.ToolOutcome(
                        call_id=outcome.call_id,
                        output=_fit(outcome.output, MAX_TOOL_OUTPUT),
                        is_error=outcome.is_error,
                    )
                )
        request = self._request(scene, session=step)
        try:
            response = await self._call(request)
        except CloudPlanError as err:
            if err.code != grpc.StatusCode.ABORTED:
                raise
            # Another call continued the conversation meanwhile (a retry racing its original):
            # once more on the conversation as it now stands; a repeated outcome is ignored.
            response = await self._call(request)
        decision = decision_from_proto(response.decision)
        if response.session_call_id:
            self._last_call = (response.session_call_id, decision.tool_name)
        return decision
