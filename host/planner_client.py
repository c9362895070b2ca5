"""Planning for the agent loop: the planner library in-process, or the cloud's Decide service.

Both transports build the same prompts (`planner.prompts`), so a decision logged by the cloud
is exactly what an in-process planner would have asked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import grpc

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc, types_pb2
from planner.decision import Decision, ThinkingBlock, Usage
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


def decision_from_proto(d: types_pb2.Decision) -> Decision:
    """The cloud's logged decision as the planner library's `Decision`."""
    try:
        arguments: dict[str, Any] = json.loads(d.arguments_json) if d.arguments_json else {}
    except json.JSONDecodeError:
        arguments = {}
    # The stored arguments mask a secret; the typed action carries what must be typed.
    if d.action.WhichOneof("kind") == "input_text" and "text" in arguments:
        arguments["text"] = d.action.input_text.text
    u = d.usage
    return Decision(
        tool_name=d.tool_name,
        arguments=arguments,
        action=d.action,
        purpose=d.purpose or d.action.purpose,
        expected_outcome=d.expected_outcome or d.action.expected_outcome,
        rationale=d.rationale or None,
        thinking=[ThinkingBlock(t.text, t.redacted) for t in d.thinking],
        usage=Usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cache_read_input_tokens=u.cache_read_input_tokens,
            cache_creation_input_tokens=u.cache_creation_input_tokens,
            thinking_tokens=u.thinking_tokens,
        ),
        provider=d.provider,
        model=d.model,
        latency_s=d.latency.ToTimedelta().total_seconds() if d.HasField("latency") else 0.0,
        forced_retry=d.forced_retry,
        system_prompt=d.system_prompt,
        user_prompt=d.user_prompt,
        corrective_retries=d.corrective_retries,
        step_index=d.step_index or None,
        extra={"decision_id": d.decision_id} if d.decision_id else {},
    )


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
