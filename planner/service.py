"""`PlannerService.Decide` for the cloud transport, wired to the cloud through ports.

The servicer does not import `cloud`: the cloud passes in who the caller is (from its mTLS
certificate), whether a lease is live (`LeaseGate`), and where decisions go (`DecisionSink`, which
assigns the step index atomically per (task, attempt)). Order matters and is the contract:
lease first (no tokens spent and nothing logged for a stale or foreign lease), then sizes, then
the previous step's reported outcome is recorded (work already done: kept when the budget
refuses this step), then the task's budget (`BudgetGate`: FAILED_PRECONDITION "budget
exhausted: …", no call made), then the provider, then exactly one appended row. A provider
failure logs no decision (the calls the provider answered before it are counted through
`SpendLog`: it billed them, and so are those of a Decide its host cancelled or let run past its
deadline); its class decides the status code (see the proto): planning temporarily impossible
is UNAVAILABLE or RESOURCE_EXHAUSTED (the host waits and asks again), refused credentials
PERMISSION_DENIED (with `amc-refused-by: provider`), no usable decision (a model refusal
included: `PlannerRefused`, never retried) UNKNOWN. The screenshot is passed to the model call
and then dropped: it is never part of what the sink receives.

Session mode (`DecideRequest.session`): the conversation lives behind a `SessionStore` the cloud
provides (one view per call, so two calls continuing one conversation at once are caught), and
the request carries only this step — the goal, the scene, the previous call's outcome. The
planner turns it into the same items the direct transport would (`continue_session`).

Typed requests (`DecideRequest.observation`, the contract hosts use): the host sends only what
it sees and what its last action did. The goal comes from the task, the history from the
attempt's decisions (`AttemptLog`, which also records the reported outcome), and the mode is
this service's (`mode`); `plan_step` does the rest, exactly as the direct transport does. The
prompt-carrying forms above are deprecated and answered for one release.

A typed request may name its step (`step_key`): a retry after a lost answer then gets the
decision already logged under that key (`replayed`), or joins the plan still running for it on
this replica (`planner.step_once`), so one step is planned once and logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import grpc

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc, types_pb2
from planner import late_calls, unsettled
from planner.convert import decision_to_proto, fit_record
from planner.decide_limits import (
    MAX_GOAL,
    MAX_SCENE_JSON,
    MAX_SCREENSHOT,
    MAX_SHORT_FIELD,
    MAX_SYSTEM_PROMPT,
    MAX_TOOL_OUTPUT,
    MAX_USER_PROMPT,
)
from planner.decision import Billed, Decision
from planner.errors import (
    MAX_STATUS_DETAILS,
    MODEL_PROVIDER,
    REFUSED_BY_KEY,
    REFUSED_BY_PROVIDER,
    RETRY_AFTER_KEY,
    WAITING_FOR_KEY,
    PlannerAuthError,
    PlannerError,
    PlannerRateLimited,
    PlannerTransient,
    SessionStateError,
    cut_off_label,
    take_billed,
    take_cut_off,
    take_in_flight,
)
from planner.late_calls import count_when_answered
from planner.observation import (
    clip,
    observation_problem,
    scene_from_observation,
)
from planner.plan_step import plan_step
from planner.planner import Planner
from planner.session.step_planner import Outcome, call_id_of, continue_session
from planner.session.store import SessionConflict, SessionStore
from planner.step_once import StepId, StepPlans, step_key_problem
from planner.steps import PastStep, checked, noted, outcome_problem, unknown_verdict
from planner.tools import Judgement
from planner.unsettled import CallLedger

if TYPE_CHECKING:  # a cloud that plans offline never loads the provider SDKs
    from planner.session.factory import SessionPlanners
    from planner.session.planner import SessionPlanner

log = logging.getLogger(__name__)


def _provider_wait(err: PlannerTransient) -> tuple[tuple[str, str], ...]:
    """Trailing metadata of an answer that says the model provider is what planning waits for
    (and how long it asked to wait, when it said)."""
    if err.retry_after is None:
        return ((WAITING_FOR_KEY, MODEL_PROVIDER),)
    return ((WAITING_FOR_KEY, MODEL_PROVIDER), (RETRY_AFTER_KEY, f"{err.retry_after:g}"))


#: How a PNG and a JPEG begin, the two formats Decide takes.
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff")


class LeaseGate(Protocol):
    """Answers whether (task, attempt, lease id) is `host_id`'s live lease right now."""

    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool: ...


class DecisionSink(Protocol):
    """Appends one decision row and returns (decision_id, step_index); finds a logged one by the
    host's step key.

    The step index is 1-based per (task, attempt), assigned atomically with the insert so
    concurrent appends never share or skip an index. The decision's `user_prompt` is already
    masked; a sensitive `input_text` value must be stored via `Decision.masked_arguments()` /
    `planner.convert.decision_to_proto()` (both mask), never from `Decision.arguments`.
    """

    async def append(
        self, host_id: str, task_id: str, attempt: int, decision: Decision, step_key: str = ""
    ) -> tuple[str, int] | None:
        """None when `step_key` is set and the attempt already logged a decision under it."""
        ...

    async def logged(self, task_id: str, attempt: int, step_key: str) -> types_pb2.Decision | None:
        """The decision logged under `step_key` (as stored: a sensitive value masked)."""
        ...


class SpendLog(Protocol):
    """Where the answered calls of a decision that failed are counted: no decision row is
    logged for it, yet the provider billed them, and the task's budget, the fleet's daily cap
    and the spending ledger must see them."""

    async def failed(
        self, host_id: str, task_id: str, attempt: int, billed: Billed, error: str
    ) -> None:
        """Count `billed` for the attempt (`error`: the planner error's class)."""
        ...


class AttemptLog(Protocol):
    """What the cloud knows of an attempt: the task's goal, the attempt's earlier decisions
    with their reported outcomes, and where a newly reported outcome is recorded."""

    async def goal(self, task_id: str) -> str | None: ...

    async def steps(self, task_id: str, attempt: int) -> list[PastStep]: ...

    async def record_outcome(
        self,
        task_id: str,
        attempt: int,
        outcome: types_pb2.ActionOutcome,
        *,
        checked_by_cloud: bool = False,
    ) -> None:
        """Record on the decision `outcome.step_index` names, unless it has one already
        (`checked_by_cloud`: the verdict is the cloud's, the host sent none)."""
        ...

    async def record_judgement(
        self, task_id: str, attempt: int, step_index: int, judgement: Judgement
    ) -> None:
        """Record the model's judgement of decision `step_index` (first one wins)."""
        ...

    async def flows(self, task_id: str, goal: str, attempt: int) -> list[types_pb2.Flow]:
        """The learned flows the attempt was handed, best first, with the goal's parameter
        values (empty: no replay)."""
        ...

    async def record_replay(
        self,
        task_id: str,
        attempt: int,
        *,
        flow_id: str,
        steps_replayed: int,
        diverged_at: int,
        reason: str,
    ) -> None:
        """How the attempt's replay stands after this decision."""
        ...


class ProviderHealth(Protocol):
    """Hears how each provider call of Decide went, so the cloud can tell an outage that hits
        every task (and stop handing out new ones) from one task's bad luck. Awaited before Decide
    answers: a pause it sets is stored for every replica before the host hears of the failure."""

    async def failed(self, reason: str) -> None:
        """A Decide found planning temporarily impossible (provider overloaded, failing, rate
        limited, unreachable)."""
        ...

    async def refused(self, reason: str) -> None:
        """A Decide found the provider refusing the credentials (`PlannerAuthError`): every
        call will be refused until an operator acts."""
        ...

    async def succeeded(self) -> None:
        """A Decide got a decision from the provider."""
        ...


class BudgetGate(Protocol):
    """Whether the task (and the fleet today) may spend on one more model call."""

    async def refusal(self, task_id: str) -> str | None:
        """Why not ("budget exhausted: … of …", `planner/budget.py`), or None when it may."""
        ...


class _Reported(NamedTuple):
    """What a typed Decide has before it plans: the goal, the attempt's earlier steps, and the
    previous step's outcome as recorded (checked by the cloud when the host sent no verdict)."""

    goal: str
    history: list[PastStep]
    previous: types_pb2.ActionOutcome | None


class _NoHealth:
    async def failed(self, reason: str) -> None:
        return None

    async def refused(self, reason: str) -> None:
        return None

    async def succeeded(self) -> None:
        return None


HostIdentity = Callable[[grpc.aio.ServicerContext], str]
"""Reads the caller's host id from the grpc.aio ServicerContext (the cloud uses the mTLS SAN)."""
SessionStoreFactory = Callable[[], SessionStore]
"""A fresh `SessionStore` view for one Decide call (it detects concurrent continuations)."""
CallLedgers = Callable[[str, str, int], CallLedger]
"""Where the markers of a Decide's model calls go: (host id, task id, attempt) -> its ledger
(`planner.unsettled`; the cloud's `unsettled_calls`)."""
ThinkingFeed = Callable[[str, int, str], None]
"""Publishes live thinking (task id, attempt, text delta) to whoever watches; never stored."""


def _lease_named(request: planner_service_pb2.DecideRequest) -> str:
    """The lease a refusal is about, its ids clipped so the status details stay bounded."""
    lease = clip(request.lease_id, MAX_STATUS_DETAILS // 2)
    task = clip(request.task_id, MAX_STATUS_DETAILS // 2)
    return f"lease {lease!r} of task {task!r} attempt {request.attempt}"


class PlannerServicer(planner_service_pb2_grpc.PlannerServiceServicer):
    """Decide: lease check, size checks, one provider decision, one decision-log row."""

    def __init__(
        self,
        *,
        caller_host_id: HostIdentity,
        lease_gate: LeaseGate,
        sink: DecisionSink,
        planner: Planner,
        attempts: AttemptLog,
        mode: Literal["compact", "session"] = "compact",
        sessions: SessionPlanners | None = None,
        session_store: SessionStoreFactory | None = None,
        live_thinking: ThinkingFeed | None = None,
        health: ProviderHealth | None = None,
        budget: BudgetGate | None = None,
        spend: SpendLog | None = None,
        call_ledgers: CallLedgers | None = None,
    ) -> None:
        if mode == "session" and (sessions is None or session_store is None):
            raise ValueError(
                "AMC_PLANNER_MODE=session needs a provider that keeps a conversation: set "
                "AMC_PLANNER_PROVIDER=anthropic or openai on the cloud, or use compact mode"
            )
        self._attempts = attempts
        self.mode = mode
        self._caller_host_id = caller_host_id
        self._leases = lease_gate
        self._sink = sink
        self._planner = planner
        self._sessions = sessions
        self._session_store = session_store
        self._live_thinking = live_thinking
        self._health: ProviderHealth = health or _NoHealth()
        self._plans = StepPlans()
        #: Plans whose callers went away, logged when they end (`_log_when_planned`).
        self._unheard: set[asyncio.Future[None]] = set()
        #: Decisions being logged under a step key, by identity (`_log`).
        self._logging: dict[int, asyncio.Future[tuple[str, int] | None]] = {}
        self._budget = budget
        self._spend = spend
        self._call_ledgers = call_ledgers

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
                f"{_lease_named(request)} is not a live lease of host {host_id!r}",
            )
        typed = request.HasField("observation")
        session = not typed and request.HasField("session")
        if typed:
            problem = _typed_problem(request)
        elif request.step_key:
            problem = "step_key: only with observation (not with the deprecated forms)"
        elif session:
            problem = _session_problem(request)
        elif not (request.system_prompt or request.user_prompt):
            problem = "observation: required (what the screen shows now)"
        else:
            problem = _size_problem(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        step_key = request.step_key
        if step_key:
            stored = await self._sink.logged(request.task_id, request.attempt, step_key)
            if stored is not None:  # a retry after a lost answer: the same decision again
                return planner_service_pb2.DecideResponse(decision=stored, replayed=True)
        # The previous step's outcome is the record of work already done: kept even when this
        # step is refused for the budget below (the last step of a spent budget was lost).
        reported = await self._record_previous(request, context) if typed else None
        if self._budget is not None:
            refusal = await self._budget.refusal(request.task_id)
            if refusal:  # before any provider call: nothing is spent past a cap
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        if self._call_ledgers is not None:  # this Decide's calls leave a trace should we die
            unsettled.ledger.set(self._call_ledgers(host_id, request.task_id, request.attempt))

        try:
            if reported is not None:
                decision = await self._decide_typed(request, host_id, reported)
            elif session:
                decision = await self._counted(
                    host_id, request, lambda: self._decide_session(request, context)
                )
            else:
                decision = await self._counted(
                    host_id, request, lambda: self._decide_compact(request)
                )
        except SessionConflict as err:
            await context.abort(grpc.StatusCode.ABORTED, str(err))
        except SessionStateError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except PlannerRateLimited as err:
            await self._health.failed(str(err))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err), _provider_wait(err))
        except PlannerTransient as err:
            await self._health.failed(str(err))
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err), _provider_wait(err))
        except PlannerAuthError as err:
            await self._health.refused(str(err))
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                str(err),
                ((REFUSED_BY_KEY, REFUSED_BY_PROVIDER),),
            )
        except PlannerError as err:
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        step = (request.task_id, request.attempt, step_key)
        try:
            await self._health.succeeded()
            logged = await self._log(host_id, request.task_id, request.attempt, decision, step_key)
        except asyncio.CancelledError:
            if reported is not None and step_key:  # planned: logged all the same
                self._log_when_planned(step, host_id, reported)
            raise
        self._plans.logged(step)
        stored = None
        if logged is None:  # a retry here or on another replica logged this step: answer with it
            stored = await self._sink.logged(request.task_id, request.attempt, step_key)
            assert stored is not None, "append refuses a step key only when it is logged"
            step_index = stored.step_index
        else:
            decision_id, step_index = logged
        if not await self._leases.is_live(
            host_id, request.task_id, request.attempt, request.lease_id
        ):
            # Cancelled, swept or superseded while the model was answering (seconds): the
            # decision is logged (it was paid for and belongs to the record), but no action of
            # a lease that is gone goes to the phone, whether or not its host heard the revoke,
            # and whoever logged it (this call, a plan it joined, another replica).
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{_lease_named(request)} ended while the model was deciding (the decision is "
                f"logged as step {step_index}, not to be acted on)",
            )
        if stored is not None:
            return planner_service_pb2.DecideResponse(decision=stored, replayed=True)
        decision.step_index = step_index
        return planner_service_pb2.DecideResponse(
            decision=decision_to_proto(
                decision,
                decision_id=decision_id,
                host_id=host_id,
                task_id=request.task_id,
                attempt=request.attempt,
                reveal_sensitive=True,
            ),
            session_call_id=call_id_of(decision),
        )

    async def _counted(
        self,
        host_id: str,
        request: planner_service_pb2.DecideRequest,
        plan: Callable[[], Awaitable[Decision]],
    ) -> Decision:
        """`plan`, with the answered calls of a decision that fails counted (`SpendLog`) before
        its error goes on: the provider billed them though no decision row is logged. Run inside
        the plan a retried step joins, so they are counted once, even when every caller went
        away. Should counting fail (the database went away), the planner's error still goes
        on: the host is told why its step failed, and the calls stay uncounted (logged).
        A Decide its host gave up on (cancelled, past its deadline: the handler is cancelled
        inside the decision) counts them too, shielded from a second cancel, and the call it
        left under way once the provider answers it (`InFlight`), or what a streamed call it cut
        off, or one not streamed the provider answered as failed, had reported (labelled by
        `cut_off_label`)."""
        try:
            return await plan()
        except (Exception, asyncio.CancelledError) as err:
            # Any error: a conversation its store failed to keep (the database dropped) carries
            # what the decision's answered calls cost too (`deciding.decide`).
            in_flight = take_in_flight(err)
            if in_flight is not None and self._spend is not None:
                spend, error = self._spend, type(err).__name__

                async def count(late: Billed) -> None:
                    await spend.failed(host_id, request.task_id, request.attempt, late, error)

                count_when_answered(in_flight, count)
            cut_off = cut_off_label(err)
            counts = ((take_billed(err), type(err).__name__), (take_cut_off(err), cut_off))
            for billed, error in counts:
                if billed is None or self._spend is None:
                    continue
                try:
                    await asyncio.shield(
                        self._spend.failed(host_id, request.task_id, request.attempt, billed, error)
                    )
                except Exception as failure:
                    log.error(
                        "the failed decision's model calls (%d tokens, $%.4f) were not counted: %s",
                        billed.usage.billed_tokens,
                        billed.usage.cost_usd,
                        type(failure).__name__,
                    )
            raise

    async def _record_previous(
        self, request: planner_service_pb2.DecideRequest, context: Any
    ) -> _Reported:
        """A typed request's goal and history from the cloud's records, with the previous
        outcome the host reports checked and recorded on the decision it names."""
        task_id, attempt = request.task_id, request.attempt
        goal = await self._attempts.goal(task_id)
        if goal is None:  # the lease was live a moment ago: the task is being removed
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"task {task_id!r} is gone")
            raise AssertionError("abort returns only by raising")  # pragma: no cover
        history = await self._attempts.steps(task_id, attempt)
        previous = request.previous_outcome if request.HasField("previous_outcome") else None
        if previous is not None:
            problem = outcome_problem(previous, history)
            if problem:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            previous, unknown = unknown_verdict(previous)
            # A host that runs no checker gets the cloud's reading of this observation.
            scene = scene_from_observation(request.observation)
            previous, by_cloud = checked(previous, history, scene)
            assert previous is not None
            recorded = previous
            if unknown:  # the record says so; the model is shown the check as usual
                recorded = types_pb2.ActionOutcome()
                recorded.CopyFrom(previous)
                noted(recorded, unknown, request.previous_outcome.evidence)
            await self._attempts.record_outcome(
                task_id, attempt, recorded, checked_by_cloud=by_cloud
            )
        return _Reported(goal, history, previous)

    async def _decide_typed(
        self, request: planner_service_pb2.DecideRequest, host_id: str, reported: _Reported
    ) -> Decision:
        """The contract's form: goal and history from the cloud's records, mode from its
        settings, the screen and the last outcome from the host."""
        task_id, attempt = request.task_id, request.attempt
        goal, history, previous = reported
        flows = await self._attempts.flows(task_id, goal, attempt)

        async def plan() -> Decision:
            if self.mode == "compact":
                return await plan_step(
                    self._planner,
                    goal=goal,
                    history=history,
                    observation=request.observation,
                    previous_outcome=previous,
                    screenshot=request.screenshot or None,
                    flows=flows,
                )
            planner = await self._open_session(task_id, attempt)
            try:
                return await plan_step(
                    planner,
                    goal=goal,
                    history=history,
                    observation=request.observation,
                    previous_outcome=previous,
                    flows=flows,
                    logged=True,
                )
            finally:
                await planner.aclose()

        def counted() -> Awaitable[Decision]:
            return self._counted(host_id, request, plan)

        if not request.step_key:
            decision = await counted()
            await self._after_decision(task_id, attempt, history, previous, decision)
            return decision
        # A retry of a step still planning (or planned, but not logged) here joins that plan.
        step = (task_id, attempt, request.step_key)
        try:
            decision = await self._plans.plan(step, counted)
            await self._after_decision(task_id, attempt, history, previous, decision)
        except asyncio.CancelledError:  # planning, or planned: logged when planned
            self._log_when_planned(step, host_id, reported)
            raise
        return decision

    async def _log(
        self, host_id: str, task_id: str, attempt: int, decision: Decision, step_key: str
    ) -> tuple[str, int] | None:
        """Log a decision: (its id, its step index), or None when the step was logged before.

        Callers of one plan (a retry joins it) share the decision, and log it once between
        them: the first writes, the others wait for that write and answer from the log. The
        write (`_log_once`) is kept only while it runs; once it has succeeded the decision
        carries its step index, so a caller that comes later knows it is logged. A write that
        failed leaves neither: the next caller tries again. The decision is first cut to what
        one record may take (`fit_record`): the reply is built from it after."""
        fit_record(decision)
        if not step_key:
            return await self._sink.append(host_id, task_id, attempt, decision)
        if decision.step_index is not None:
            return None
        writing = self._logging.get(id(decision))
        if writing is not None:
            await asyncio.shield(writing)
            return None
        writing = asyncio.ensure_future(
            self._log_once(host_id, task_id, attempt, decision, step_key)
        )
        self._logging[id(decision)] = writing
        writing.add_done_callback(lambda _: self._logging.pop(id(decision), None))
        return await asyncio.shield(writing)

    async def _log_once(
        self, host_id: str, task_id: str, attempt: int, decision: Decision, step_key: str
    ) -> tuple[str, int] | None:
        """Append the decision under its step key. When another replica planned the same step
        (the host's retry reached it while this plan ran) and logged its own decision first,
        this plan's model calls were paid for all the same: they are counted as a failed
        decision's (`SpendLog`), once, as nothing else of them is kept."""
        logged = await self._sink.append(host_id, task_id, attempt, decision, step_key)
        if logged is not None:
            decision.step_index = logged[1]
            return logged
        stored = await self._sink.logged(task_id, attempt, step_key)
        assert stored is not None, "append refuses a step key only when it is logged"
        usage = decision.usage
        if self._spend is not None and (usage.billed_tokens or usage.cost_usd):
            billed = Billed(decision.provider, decision.model, usage)
            await self._spend.failed(host_id, task_id, attempt, billed, "planned twice")
        decision.step_index = stored.step_index
        return None

    async def finish_plans(self, within: float) -> None:
        """Before the replica stops: let the plans in flight end and be logged, for up to
        `within` seconds, then cut off the rest and give their counting (`_counted`) up to
        `within` seconds more.

        A stopping replica (a rolling deploy, SIGTERM) cancels its Decide handlers, but their
        plans outlived them only until the planner and the database closed under them a moment
        later: a model call the provider answered was then neither logged nor counted, and the
        host's retry on the next replica asked (and paid) again. A cut-off call not streamed
        (compact mode) is counted once it answers, if it does within that second bound. A
        handler cancelled after its plan ended (writing its decision, or what it says of the
        step before) hands the decision on too, and its write is waited for in that bound:
        it was left to the process's exit, which cut it off."""
        plans = self._plans.unfinished()
        if plans:
            log.info("waiting up to %.0f s for %d model call(s) in flight", within, len(plans))
            _, late = await asyncio.wait(plans, timeout=within)
        else:
            late = set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                if late:
                    for plan in late:
                        plan.cancel()
                    await asyncio.wait(late)
                    log.info(
                        "cut off %d model call(s); waiting up to %.0f s to count them",
                        len(late),
                        within,
                    )
                    await late_calls.settle()  # a call not streamed: counted once answered
                await asyncio.sleep(0)  # a handler the stop cancelled hands its plan on
                if self._unheard:  # logged (`_log_when_planned`)
                    log.info(
                        "waiting up to %.0f s for %d decision(s) to be logged",
                        within,
                        len(self._unheard),
                    )
                    await asyncio.wait(set(self._unheard))

    def _log_when_planned(self, step: StepId, host_id: str, reported: _Reported) -> None:
        """Log the step's decision once its plan ends, for a caller that went away meanwhile.

        The plan outlives its caller so that a retry joins it, but a retry may never come: a
        host killed mid-step starts the task's next attempt from its new process. The model's
        answer is paid for all the same; logged, its cost is in the task's totals and the
        day's spending, and a retry that does come is answered from the log. A plan that fails
        counts its answered calls itself (`_counted`)."""
        future = self._plans.running(step)
        if future is None:
            return
        task_id, attempt, step_key = step

        async def log_it() -> None:
            try:
                decision = await asyncio.shield(future)
            except Exception:
                return
            try:
                await self._after_decision(
                    task_id, attempt, reported.history, reported.previous, decision
                )
                logged = await self._log(host_id, task_id, attempt, decision, step_key)
            except Exception as err:  # kept in the plans: a retry logs it
                log.warning(
                    "step %s, planned after its caller went away, was not logged: %s",
                    step_key,
                    type(err).__name__,
                )
                return
            self._plans.logged(step)
            if logged is not None:
                log.info(
                    "step %d planned after its caller went away: %s logged",
                    logged[1],
                    decision.tool_name,
                )

        unheard = asyncio.ensure_future(log_it())
        self._unheard.add(unheard)
        unheard.add_done_callback(self._unheard.discard)

    async def _after_decision(
        self,
        task_id: str,
        attempt: int,
        history: list[PastStep],
        previous: types_pb2.ActionOutcome | None,
        decision: Decision,
    ) -> None:
        """What the decision says about earlier steps: the model's judgement of the previous
        one, and how the attempt's replay stands."""
        if decision.previous_step is not None and previous is not None:
            await self._attempts.record_judgement(
                task_id, attempt, previous.step_index, decision.previous_step
            )
        replaying = decision.planner_mode == "replay"
        if replaying or decision.replay_divergence:
            replayed = sum(1 for s in history if s.mode == "replay" and s.tool_name != "complete")
            if replaying and decision.tool_name != "complete":
                replayed += 1
            await self._attempts.record_replay(
                task_id,
                attempt,
                flow_id=decision.flow_id,
                steps_replayed=replayed,
                diverged_at=0 if replaying else decision.flow_step,
                reason=decision.replay_divergence,
            )

    async def _open_session(self, task_id: str, attempt: int) -> SessionPlanner:
        assert self._sessions is not None and self._session_store is not None
        feed = self._live_thinking
        return await self._sessions.open(
            self._session_store(),
            task_id,
            attempt,
            on_thinking=(lambda delta: feed(task_id, attempt, delta)) if feed else None,
        )

    async def _decide_compact(self, request: planner_service_pb2.DecideRequest) -> Decision:
        screen = (request.screen_width, request.screen_height)
        return await self._planner.decide_from_prompts(
            request.system_prompt,
            request.user_prompt,
            element_ids=list(request.element_ids) or None,
            screen_size=screen if screen[0] > 0 and screen[1] > 0 else None,
            screenshot=request.screenshot or None,
        )

    async def _decide_session(
        self, request: planner_service_pb2.DecideRequest, context: Any
    ) -> Decision:
        if self._sessions is None or self._session_store is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "session mode is not offered by this cloud: its planner provider cannot keep a "
                "conversation (session mode needs AMC_PLANNER_PROVIDER=anthropic or openai on "
                "the cloud); run the host with AMC_PLANNER_MODE=compact",
            )
            raise AssertionError("abort returns only by raising")  # pragma: no cover
        step = request.session
        planner = await self._open_session(request.task_id, request.attempt)
        previous = step.previous_outcome if step.HasField("previous_outcome") else None
        screen = (request.screen_width, request.screen_height)
        try:
            return await continue_session(
                planner,
                goal=step.goal,
                scene=step.scene_json,
                page=step.page,
                element_ids=list(request.element_ids),
                screen_size=screen if screen[0] > 0 and screen[1] > 0 else None,
                outcome=Outcome(previous.call_id, previous.output, previous.is_error)
                if previous is not None
                else None,
            )
        finally:
            await planner.aclose()


def _screenshot_problem(data: bytes) -> str | None:
    """INVALID_ARGUMENT text for a screenshot Decide does not take, or None. The model is sent
    a PNG or a JPEG: other bytes went to it labelled image/png, the provider refused the whole
    request, and the step failed UNKNOWN as if the model had given no usable decision."""
    if len(data) > MAX_SCREENSHOT:
        return f"screenshot is {len(data)} bytes; at most {MAX_SCREENSHOT}"
    if data and not data.startswith(_IMAGE_MAGIC):
        return "screenshot: not a PNG or JPEG image (or leave it empty)"
    return None


def _typed_problem(request: planner_service_pb2.DecideRequest) -> str | None:
    """INVALID_ARGUMENT text for a typed request, naming the field, or None."""
    if request.system_prompt or request.user_prompt or request.HasField("session"):
        return "set observation or the deprecated prompt/session fields, not both"
    if screenshot := _screenshot_problem(request.screenshot):
        return screenshot
    if request.HasField("previous_outcome") and request.previous_outcome.step_index < 1:
        return "previous_outcome.step_index: must be 1 or more"
    return step_key_problem(request.step_key) or observation_problem(request.observation)


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
    if screenshot := _screenshot_problem(request.screenshot):
        return screenshot
    if request.screen_width < 0 or request.screen_height < 0:
        return "screen_width and screen_height must not be negative"
    return None


def _session_problem(request: planner_service_pb2.DecideRequest) -> str | None:
    """INVALID_ARGUMENT text for a session-mode request, naming the field, or None."""
    step = request.session
    if request.system_prompt or request.user_prompt:
        return "set either session or system_prompt/user_prompt, not both"
    if request.screenshot:
        return "screenshot is not sent in session mode (the conversation is stored)"
    if not step.goal.strip():
        return "session.goal is empty"
    checks = (
        ("session.goal", step.goal, MAX_GOAL),
        ("session.scene_json", step.scene_json, MAX_SCENE_JSON),
        ("session.page", step.page, MAX_SHORT_FIELD),
        ("session.previous_outcome.call_id", step.previous_outcome.call_id, MAX_SHORT_FIELD),
        ("session.previous_outcome.output", step.previous_outcome.output, MAX_TOOL_OUTPUT),
    )
    for name, value, limit in checks:
        size = len(value.encode("utf-8"))
        if size > limit:
            return f"{name} is {size} bytes; at most {limit}"
    if not step.scene_json.strip():
        return "session.scene_json is empty"
    if step.HasField("previous_outcome") and not step.previous_outcome.call_id:
        return "session.previous_outcome.call_id is empty"
    if request.screen_width < 0 or request.screen_height < 0:
        return "screen_width and screen_height must not be negative"
    return None
