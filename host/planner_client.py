"""Planning for the agent loop: the planner library in-process, or the cloud's Decide service.

Both transports build the same prompts (`planner.prompts`), so a decision logged by the cloud
is exactly what an in-process planner would have asked.
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


class CloudPlanner:
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
        self._stub = planner_service_pb2_grpc.PlannerServiceStub(channel)
        self.task_id = task_id
        self.attempt = attempt
        self.lease_id = lease_id
        self.history_window = history_window
        self.send_screenshot = send_screenshot
        self.timeout_s = timeout_s

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        user_prompt = build_user_prompt(goal, scene, history, history_window=self.history_window)
        request = planner_service_pb2.DecideRequest(
            task_id=self.task_id,
            attempt=self.attempt,
            lease_id=self.lease_id,
            system_prompt=SYSTEM_PROMPT,
            user_prompt=user_prompt,
            element_ids=[e.element_id for e in scene.elements],
            screen_width=scene.screen_width,
            screen_height=scene.screen_height,
        )
        if screenshot and self.send_screenshot:
            request.screenshot = screenshot
        try:
            response = await self._stub.Decide(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise CloudPlanError(
                f"cloud planner: {exc.code().name}: {exc.details()}", exc.code()
            ) from exc
        decision = decision_from_proto(response.decision)
        # What was sent is what we built, whatever the cloud echoes.
        decision.system_prompt = SYSTEM_PROMPT
        decision.user_prompt = user_prompt
        return decision
