"""Planning for the agent loop: the planner in this process, or the cloud's Decide service.

Both transports send the same typed inputs: the screen as a `ScreenObservation` (converted from
perception's Scene) and the outcome of the previous decision as an `ActionOutcome`. On the
cloud transport they go to `PlannerService.Decide`, and the cloud, which knows the goal, the
attempt's history and its planning mode, builds the prompts; on the direct transport
`DirectPlanner` hands them to `planner.plan_step.plan_step`, the function the cloud calls, with a
history it keeps the way the cloud's decision log does. So both build byte-identical prompts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc, types_pb2
from cloud.cert_validity import CertificateInvalid
from host import metrics
from host.cloud_channel import AnotherHostsCertificate, CertificateMissing
from planner import budget
from planner.budget import Budget, FleetDay
from planner.convert import decision_from_proto
from planner.decide_limits import MAX_SCREENSHOT
from planner.decision import Decision, Usage
from planner.errors import (
    RETRY_AFTER_KEY,
    WAITING_FOR_KEY,
    BudgetExhausted,
    billed_of,
    cut_off_of,
)
from planner.history import MASK, WorldEvent
from planner.observation import clip, observation_from_scene
from planner.scene import Scene
from planner.steps import MAX_DRIVER_OUTPUT_BYTES, MAX_OUTCOME_ERROR_BYTES, PastStep, with_outcome
from planner.verify import MAX_EVIDENCE_BYTES, verdict_to_proto

if TYPE_CHECKING:
    # The planner engine (prompts, model profiles, the providers' code) is loaded by the
    # methods of `DirectPlanner` that run it: a host on the cloud transport (the default)
    # never plans itself and starts without it.
    from planner.planner import Planner
    from planner.session.planner import SessionPlanner


class StepPlanner(Protocol):
    """What the agent loop needs from a planner (the library's `Planner` fits as is)."""

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision: ...


log = logging.getLogger(__name__)

#: What a replayed decision whose sensitive text was not kept says instead of running.
WITHHELD = (
    "not typed: the answer to this step was lost and repeated, and a sensitive value is never "
    "kept, so it is masked in the repeat; plan the input again"
)


class CloudPlanError(RuntimeError):
    """The cloud refused or failed a Decide call. `lease_lost` when the lease is not live;
    `waiting_for` names what the cloud said is unavailable (empty when it did not say, e.g.
    the cloud itself could not be reached); `retry_after` the seconds the model provider asked
    to wait, when the cloud passed that on."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        waiting_for: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.waiting_for = waiting_for
        self.retry_after = retry_after

    @property
    def lease_lost(self) -> bool:
        return bool(self.code == grpc.StatusCode.FAILED_PRECONDITION)

    @property
    def not_the_task(self) -> bool:
        """PERMISSION_DENIED: the model provider refused the cloud's credentials (or the cloud
        refused this host the lease). Nothing the task did: its attempt ends retryable, and the
        cloud holds dispatch back until the provider takes the key again."""
        return bool(self.code == grpc.StatusCode.PERMISSION_DENIED)


def previous_outcome(
    step_index: int | None, history: Sequence[WorldEvent | dict[str, Any]]
) -> types_pb2.ActionOutcome | None:
    """The outcome of decision `step_index` from the loop's newest finished step, or None when
    no decision of this planner has finished (the first step, or a planner made after a
    restart)."""
    if step_index is None or not history:
        return None
    event = history[-1]
    if isinstance(event, WorldEvent):
        success, error, output = event.success, event.error, event.driver_output
        verdict, evidence = event.verdict, event.evidence
    else:
        success, error, output = event.get("success"), event.get("error"), None
        verdict, evidence = None, None
    return types_pb2.ActionOutcome(
        step_index=step_index,
        executed=bool(success),
        error=clip(str(error or ""), MAX_OUTCOME_ERROR_BYTES),
        driver_output=clip(str(output or ""), MAX_DRIVER_OUTPUT_BYTES),
        verdict=verdict_to_proto(verdict),
        evidence=clip(evidence or "", MAX_EVIDENCE_BYTES),
    )


class CloudPlanner:
    """`StepPlanner` over `PlannerService.Decide` for one attempt (its task, attempt, lease).

    The request carries no goal, history or prompt: the cloud has them. The goal argument is
    ignored (the cloud plans towards the task's goal); of the history only the newest step is
    read, as the outcome of the last decision, and its length numbers the step: the step key
    (`DecideRequest.step_key`) is the 1-based step of the attempt, so asking again for the same
    step (the agent loop's wait after a lost answer) sends the same key and gets the decision
    the cloud already made for it, never a second one.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel | Callable[[], Awaitable[grpc.aio.Channel]],
        task_id: str,
        attempt: int,
        lease_id: str,
        send_screenshot: bool = False,
        timeout_s: float = 120.0,
        explain: Callable[[grpc.aio.AioRpcError], str] | None = None,
        replaced: Callable[[grpc.aio.Channel], Awaitable[bool]] | None = None,
    ) -> None:
        #: Whether the certificate a refused call presented on a channel has a successor in
        #: the files (`cloud_channel.ChannelOnce.replaced`): the step is asked again.
        self._replaced = replaced
        #: The channel, or how to get it (`cloud_channel.ChannelOnce.get`: its certificate
        #: files read off the event loop, maybe not yet returned), and the stub once made.
        self._channel = channel
        self._stub: planner_service_pb2_grpc.PlannerServiceStub | None = None
        self._stub_channel: grpc.aio.Channel | None = None
        #: What a failed call says (`host.cloud_channel.failure`: whose certificate, when a
        #: handshake failed on one; the channel is opened once and outlives the certificate).
        self._explain = explain
        self.task_id = task_id
        self.attempt = attempt
        self.lease_id = lease_id
        self.send_screenshot = send_screenshot
        self.timeout_s = timeout_s
        self._last_step: int | None = None

    async def _stub_now(self) -> planner_service_pb2_grpc.PlannerServiceStub:
        """The stub, its channel awaited first when it is still being opened, and asked for at
        each call: a channel made again from a certificate issued again while the host runs
        (`ChannelOnce`) carries the next step. A channel that cannot be opened yet is the
        cloud unreachable for now (UNAVAILABLE): the agent loop waits and asks again. Its
        certificate files hang on their disk (an OSError), or hold one the cloud would
        refuse, or one of them is missing (copied in again) or names another host: the lease
        stream says so and checks them again (or stops the host). Only an OSError was
        caught: a file missing for a moment failed the step's task for good."""
        channel = self._channel
        if callable(channel):
            try:
                channel = await channel()
            except (
                OSError,
                CertificateMissing,
                CertificateInvalid,
                AnotherHostsCertificate,
            ) as exc:
                message = f"cloud planner: {exc}"
                raise CloudPlanError(message, grpc.StatusCode.UNAVAILABLE) from exc
        if self._stub is None or self._stub_channel is not channel:
            self._stub = planner_service_pb2_grpc.PlannerServiceStub(channel)
            self._stub_channel = channel
        return self._stub

    async def _call(
        self, request: planner_service_pb2.DecideRequest
    ) -> planner_service_pb2.DecideResponse:
        stub = await self._stub_now()
        started = time.perf_counter()
        try:
            response: planner_service_pb2.DecideResponse = await stub.Decide(
                request, timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            metrics.decide_seconds.labels(outcome=exc.code().name.lower()).observe(
                time.perf_counter() - started
            )
            details = exc.details() or ""
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(
                budget.PREFIX
            ):
                raise BudgetExhausted(details) from exc  # the task fails; never retried
            said = self._explain(exc) if self._explain else f"{exc.code().name}: {details}"
            message = f"cloud planner: {said}"
            if await self._identity_replaced(exc):
                # The certificate was revoked after it was issued again (rotating it): the
                # step is asked again, on a channel made from the new one (UNAVAILABLE: the
                # agent loop waits and asks again), not failed for a rotation.
                message += "; the host's certificate files hold another one: asking again"
                raise CloudPlanError(message, grpc.StatusCode.UNAVAILABLE) from exc
            raise CloudPlanError(message, exc.code(), _waiting_for(exc), _retry_after(exc)) from exc
        metrics.decide_seconds.labels(outcome="ok").observe(time.perf_counter() - started)
        return response

    async def _identity_replaced(self, exc: grpc.aio.AioRpcError) -> bool:
        """Whether `exc` refused the certificate of a channel the files have replaced since.
        Only UNAUTHENTICATED is the certificate's refusal here: Decide's PERMISSION_DENIED is
        also the model provider refusing the cloud's credentials, a step to fail at once."""
        refused = exc.code() == grpc.StatusCode.UNAUTHENTICATED
        channel = self._stub_channel
        if not refused or self._replaced is None or channel is None:
            return False
        return await self._replaced(channel)

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        request = planner_service_pb2.DecideRequest(
            task_id=self.task_id,
            attempt=self.attempt,
            lease_id=self.lease_id,
            observation=observation_from_scene(scene),
            step_key=str(len(history) + 1),
        )
        outcome = previous_outcome(self._last_step, history)
        if outcome is not None:
            request.previous_outcome.CopyFrom(outcome)
        if screenshot and self.send_screenshot:
            if len(screenshot) <= MAX_SCREENSHOT:
                request.screenshot = screenshot
            else:  # the cloud would refuse the whole step: planned from the observation alone
                log.warning(
                    "step %s: screenshot of %d bytes not sent (a Decide takes at most %d)",
                    request.step_key, len(screenshot), MAX_SCREENSHOT,
                )  # fmt: skip
        try:
            response = await self._call(request)
        except CloudPlanError as err:
            if err.code != grpc.StatusCode.ABORTED:
                raise
            # Another call continued the session conversation meanwhile (a retry racing its
            # original): once more on the conversation as it now stands.
            response = await self._call(request)
        self._last_step = response.decision.step_index or None
        decision = decision_from_proto(response.decision)
        action = decision.action
        if (
            response.replayed
            and action.WhichOneof("kind") == "input_text"
            and action.input_text.sensitive
            and action.input_text.text == MASK
        ):
            decision.extra["withheld"] = WITHHELD
        return decision


def _waiting_for(exc: grpc.aio.AioRpcError) -> str:
    """What the cloud named as unavailable in its trailing metadata, if it named anything."""
    for key, value in exc.trailing_metadata() or ():
        if key == WAITING_FOR_KEY and isinstance(value, str):
            return value[:100]
    return ""


#: The longest provider wait a host takes from the cloud's word (a day: anything longer is
#: not a wait but a mistake, and the task's deadline ends the waiting first anyway).
_MAX_RETRY_AFTER_S = 86_400.0


def _retry_after(exc: grpc.aio.AioRpcError) -> float | None:
    """The seconds the model provider asked to wait, as the cloud passed them on (None when it
    did not, or sent something that is not a number of seconds)."""
    for key, value in exc.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY and isinstance(value, str):
            try:
                seconds = float(value)
            except ValueError:
                return None
            return min(seconds, _MAX_RETRY_AFTER_S) if seconds >= 0 else None
    return None


class DirectPlanner:
    """The direct transport for one attempt: `plan_step` in this process, fed exactly what the
    cloud would get, with the attempt's steps kept here as the cloud keeps them in its log.

    `engine` is a compact `Planner` (may be shared by attempts) or this attempt's
    `SessionPlanner` (its conversation is stored, so it survives a restart; the step records
    here are only for compact prompts and start empty after one). `flows` are the learned flows
    of the assignment: `plan_step` replays them as the cloud does on its transport, leaving
    out those in `withdrawn` (the cloud's renewals add a flow disabled or retired meanwhile).

    The task's caps (`budget`, from the assignment) are checked before each call against what
    the task spent before this attempt (`spent`, the cloud's tally) plus this attempt's own
    model calls (a failed decision's answered calls too: they were billed, and a step that
    failed as temporarily impossible is asked again): once a cap is reached no further call is
    made (`BudgetExhausted`). So are the fleet's daily caps (`fleet_day`, as the cloud said
    with the assignment and each renewal, plus what this attempt spent since), as Decide checks
    them on the cloud transport.
    """

    def __init__(
        self,
        engine: Planner | SessionPlanner,
        flows: Sequence[types_pb2.Flow] = (),
        budget: Budget | None = None,
        spent: Usage | None = None,
        fleet_day: FleetDay | None = None,
        withdrawn: AbstractSet[str] = frozenset(),
    ) -> None:
        self.engine = engine
        self.flows = tuple(flows)
        self.withdrawn = withdrawn
        self.steps: list[PastStep] = []
        self.budget = budget or Budget()
        self.spent = Usage()
        if spent is not None:
            self.spent.add(spent)
        self.fleet_day = fleet_day or FleetDay()

    async def decide(
        self,
        goal: str,
        scene: Scene,
        history: Sequence[WorldEvent | dict[str, Any]] = (),
        screenshot: bytes | None = None,
    ) -> Decision:
        refusal = budget.exhausted(self.budget, self.spent) if self.budget else None
        refusal = refusal or self.fleet_day.refusal()
        if refusal:
            metrics.budget_refusals.inc()
            raise BudgetExhausted(refusal)
        from planner.plan_step import plan_step  # the engine: see the note on the imports

        outcome = previous_outcome(self.steps[-1].step_index if self.steps else None, history)
        try:
            decision = await plan_step(
                self.engine,
                goal=goal,
                history=self.steps,
                observation=observation_from_scene(scene),
                previous_outcome=outcome,
                screenshot=screenshot,
                flows=[f for f in self.flows if f.flow_id not in self.withdrawn],
            )
        except Exception as err:
            # Billed, though no decision came of it: the answered calls, and what a stream the
            # provider broke off had reported (counted, and taken, by the agent loop). Any
            # error: a session store that could not keep the model's turn (a disk fault) ends
            # the decision after the provider answered, as a planner error does.
            for billed in (billed_of(err), cut_off_of(err)):
                if billed is not None:
                    self.spent.add(billed.usage)
                    self.fleet_day.spend(billed.usage)
            raise
        self.steps = with_outcome(self.steps, outcome)
        self.steps.append(PastStep.from_decision(decision, len(self.steps) + 1))
        self.spent.add(decision.usage)
        self.fleet_day.spend(decision.usage)
        return decision

    async def aclose(self) -> None:
        """Closes a session engine (its conversation is stored); a shared compact planner is
        closed by its owner."""
        from planner.planner import Planner

        if not isinstance(self.engine, Planner):
            await self.engine.aclose()
