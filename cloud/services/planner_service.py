"""PlannerService on the cloud: the planner's servicer on the cloud's ports, for hosts only.

The planner (`planner.service`) knows nothing of the cloud: it is handed who the caller is, a
`LeaseGate`, a `DecisionSink`, a `BudgetGate` and a session store. This wires those to the
cloud's store and adds the one rule only the cloud can know: a host may plan only on its own
leases. Who may call Decide at all (hosts) is `cloud.authz`. It is also where each Decide is
observed as a whole: its latency and outcome (`amc_cloud_decide_seconds`), the task, attempt,
host, step and model on the server span and on every log line the call writes.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import trace
from sqlalchemy import exc as sa_exc

from amc.v1 import lease_service_pb2, planner_service_pb2, planner_service_pb2_grpc, types_pb2
from cloud import authz, metrics
from cloud.dispatch_holds import DispatchHolds
from cloud.events import EventBus
from cloud.lease.validate import MAX_ID
from cloud.metrics import start_of_day
from cloud.provider_health import ProviderHealth
from cloud.settings import CloudSettings, SettingError
from cloud.store import holds, leases, spend, tasks
from cloud.store.database import Store
from cloud.store.holds import Hold
from cloud.store.ports import (
    FlowsHanded,
    StoreAttemptLog,
    StoreDecisionSink,
    StoreLeaseGate,
    StoreSessionStore,
)
from cloud.store.unsettled import StoreCallLedger
from planner.budget import Budget, exhausted
from planner.convert import usage_to_proto
from planner.decision import Usage
from planner.errors import CLOUD_DATABASE, REFUSED_BY_KEY, REFUSED_BY_LEASE, WAITING_FOR_KEY
from planner.vendors.base import Probeable
from planner.vendors.observed import ObservedAdapter
from telemetry import logs, tracing

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # imported when the servicer is built, like the rest of the planner
    from planner.service import PlannerServicer

log = logging.getLogger(__name__)

#: What a host is told while the database cannot be reached: it asks again, the step waits.
DATABASE_UNAVAILABLE = "the cloud's database is unavailable; retry"
_UNREACHABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    ConnectionError,
)


def _database_unreachable(exc: BaseException) -> bool:
    """The database cannot be reached right now (restarting, a dropped connection, no pool
    connection in time): retrying helps. Told by type, never by the driver's text."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, _UNREACHABLE)


class OwnLeasesOnly(planner_service_pb2_grpc.PlannerServiceServicer):
    """Refuses a Decide on another host's lease before the planner sees it (PERMISSION_DENIED:
    "lease … of task … belongs to another host", trailing metadata `amc-refused-by: lease`);
    anything else goes to the planner.

    A database that cannot be reached at any point of the call is UNAVAILABLE with a generic
    message (never the driver's text: it names the database's host and port), so the host's
    step waits and asks again instead of failing its task.
    """

    def __init__(
        self, inner: PlannerServicer, store: Store, provider: str = "", model: str = ""
    ) -> None:
        self._inner = inner
        self._store = store
        self._provider = provider
        self._model = model

    async def finish_plans(self, within: float) -> None:
        """`PlannerServicer.finish_plans`: before the replica stops."""
        await self._inner.finish_plans(within)

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        host_id = authz.caller().name
        task_id, attempt = request.task_id[:MAX_ID], request.attempt
        span = trace.get_current_span()
        tracing.set_attributes(
            span, {"amc.task_id": task_id, "amc.attempt": attempt, "amc.host_id": host_id}
        )
        started = time.perf_counter()
        outcome = "ok"
        with logs.bound(task_id=task_id, attempt=attempt, host_id=host_id):
            try:
                response = await self._decide_or_unavailable(request, context)
            except BaseException:
                code = context.code()
                outcome = code.name.lower() if code is not None else "error"
                raise
            finally:
                metrics.current().decide.labels(
                    provider=self._provider, model=self._model, outcome=outcome
                ).observe(time.perf_counter() - started)
            d = response.decision
            u = d.usage
            log.info(
                "step %d decided: %s (%s/%s, %d tokens in, %d out, $%.4f)",
                d.step_index, d.tool_name, d.provider, d.model, u.input_tokens, u.output_tokens,
                u.cost_usd, extra={"step": d.step_index},
            )  # fmt: skip
            tracing.set_attributes(
                span,
                {
                    "amc.step": d.step_index,
                    "gen_ai.system": d.provider,
                    "gen_ai.response.model": d.model,
                    "gen_ai.usage.input_tokens": u.input_tokens,
                    "gen_ai.usage.output_tokens": u.output_tokens,
                    "amc.usage.cache_read_tokens": u.cache_read_input_tokens,
                    "amc.usage.cache_write_tokens": u.cache_creation_input_tokens,
                    "amc.usage.thinking_tokens": u.thinking_tokens,
                    "amc.usage.cost_usd": u.cost_usd,
                },
            )
        return response

    async def _decide_or_unavailable(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        """`_decide`, with a database the cloud cannot reach answered as UNAVAILABLE (the host
        waits inside its lease and asks again) rather than as an unknown error."""
        try:
            return await self._decide(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if not _database_unreachable(exc):
                raise
            log.warning("Decide: the database is unavailable (%s)", type(exc).__name__)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                DATABASE_UNAVAILABLE,
                ((WAITING_FOR_KEY, CLOUD_DATABASE),),
            )
            raise AssertionError("abort returns only by raising") from exc  # pragma: no cover

    async def _decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        if len(request.lease_id) <= MAX_ID:  # a longer one is no lease: the planner says so
            # Another host's lease is not "not live" but none of this host's business.
            held = await leases.lease_owner(
                self._store, request.task_id[:MAX_ID], request.attempt, request.lease_id
            )
            owner, transport = held or (None, 0)
            if owner is not None and owner != authz.caller().name:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"lease {request.lease_id!r} of task {request.task_id!r} belongs to "
                    "another host",
                    ((REFUSED_BY_KEY, REFUSED_BY_LEASE),),
                )
            if transport == types_pb2.PLANNER_TRANSPORT_DIRECT:
                # Its host plans it and ships the decisions: the cloud's would mix into them,
                # on a host the dispatcher does not hold back when the provider fails.
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"task {request.task_id!r} attempt {request.attempt} is planned by its "
                    "host (direct transport): it ships its decisions (ShipDecisions)",
                )
        return await self._inner.Decide(request, context)


class CloudBudgets:
    """`BudgetGate` on the store: the task's own caps, then the fleet's daily ones.

    While the day's tally (shared by every replica: it is read from the store) is past this
    replica's daily cap, new tasks are held back from every host (`daily_hold`, asked by the
    dispatcher each round and by the fleet page): they would fail at their first step, or spend
    past the cap. The hold is not latched: it ends with the UTC day, and with a replica started
    with a higher cap (the cap is a setting, read at start). The first replica to find it records
    it in `dispatch_holds`, so every replica says since when and who found it.
    """

    def __init__(
        self, store: Store, settings: CloudSettings, shared: DispatchHolds | None = None
    ) -> None:
        self._store = store
        self._daily = Budget(settings.daily_max_tokens, settings.daily_max_cost_usd)
        self._holds = shared
        #: Today's spending, read at most once a second (the metrics read it too).
        self.spend = spend.DailySpend(store)

    async def daily_hold(self) -> Hold | None:
        """While today's fleet budget is spent: why, since when and which replica found it;
        None otherwise."""
        why = await self.daily_spent()
        if why is None:
            return None
        found = self._holds.get(holds.DAILY_BUDGET) if self._holds is not None else None
        if found is None:
            return Hold(holds.DAILY_BUDGET, why, self._store.now(), "")
        return Hold(holds.DAILY_BUDGET, why, found.set_at, found.set_by)

    def _fleet_day(self, day: dt.datetime, spent: Usage) -> lease_service_pb2.FleetDay:
        return lease_service_pb2.FleetDay(
            caps=types_pb2.TaskBudget(
                max_tokens=self._daily.max_tokens, max_cost_usd=self._daily.max_cost_usd
            ),
            spent=usage_to_proto(spent),
            day=f"{day:%Y-%m-%d}",
        )

    async def fleet_day(self) -> lease_service_pb2.FleetDay | None:
        """The daily caps and today's tally (read at most once a second), for a renewal of a
        direct-transport host, which checks them before each model call; None without a cap."""
        if not self._daily:
            return None
        today = start_of_day(self._store.now())
        return self._fleet_day(today, await self.spend.today(today))

    def fleet_day_known(self) -> lease_service_pb2.FleetDay | None:
        """The same without reading (an assignment is sent right after its claim, with no
        wait between): the tally as the dispatcher read it before the claim; None without a
        cap or before today's first read."""
        if not self._daily:
            return None
        today = start_of_day(self._store.now())
        spent = self.spend.known(today)
        return None if spent is None else self._fleet_day(today, spent)

    async def refusal(self, task_id: str) -> str | None:
        found = await tasks.budget_and_spent(self._store, task_id)
        if found is not None and Budget(*found[0]):
            why = exhausted(Budget(*found[0]), found[1])
            if why:
                metrics.current().budget_refusals.labels(scope="task").inc()
                return why
        why = await self.daily_spent()
        if why:
            metrics.current().budget_refusals.labels(scope="fleet_daily").inc()
        return why

    async def daily_spent(self) -> str | None:
        """Why today's fleet budget is spent ("budget exhausted: … (UTC day …)"); None while it
        is not. Asked by Decide, and by the dispatcher each round before any host gets a task:
        a direct-transport host calls the model itself (no Decide of its is ever refused), and
        a cloud-transport host's task would fail at its first step."""
        if not self._daily:
            return None
        today = start_of_day(self._store.now())
        spent_today = await self.spend.today(today)
        why = exhausted(self._daily, spent_today, whose="the fleet's daily")
        shared = self._holds
        found = shared.get(holds.DAILY_BUDGET) if shared is not None else None
        stale = found is not None and (not why or start_of_day(found.set_at) != today)
        if shared is not None and stale:  # a raised cap, or a new day
            await shared.lift((holds.DAILY_BUDGET,))
            found = None
        if not why:
            return None
        why = f"{why} (UTC day {today:%Y-%m-%d})"
        if shared is not None and found is None:
            log.warning("holding new tasks back until 00:00 UTC: %s", why)
            await shared.hold(holds.DAILY_BUDGET, why)
        return why


def _caller_host_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    who = authz.caller()
    return who.name if who.kind == "host" else ""


def build_planner_servicer(
    store: Store,
    bus: EventBus,
    health: ProviderHealth | None = None,
    handed: FlowsHanded | None = None,
    budgets: CloudBudgets | None = None,
    clock_settled: Callable[[], Awaitable[None]] | None = None,
) -> tuple[OwnLeasesOnly, list[Any], str]:
    """The planner servicer on the cloud's ports, what must be closed with the server, and a
    line saying which planner it is (for the start-up banner).

    The planner settings (`AMC_PLANNER_*`, read here) choose the provider and the mode hosts'
    typed requests are planned in (`AMC_PLANNER_MODE`, compact by default). Session mode needs a
    provider that keeps conversations: asking for it with the offline provider is a
    `SettingError`; deprecated session steps get UNIMPLEMENTED there, as before. `health` hears
    every Decide's outcome and gets the model's probe (the offline provider has none: it is
    never down). `handed` reads the learned flows an attempt was given (replayed inside
    Decide); None: no replay.
    """
    from planner.planner import make_planner
    from planner.service import PlannerServicer
    from planner.settings import PlannerSettings

    planner_settings = PlannerSettings()
    planner = make_planner(planner_settings)
    if health is not None and isinstance(planner.provider, Probeable):
        health.probe = planner.provider.probe
        health.key_setting = f"AMC_PLANNER_{planner_settings.resolved_provider.upper()}_API_KEY"
    if isinstance(planner.provider, ObservedAdapter):  # the cloud counts every model call
        planner.provider.observer = metrics.MODEL_CALLS
    sessions = None
    if planner_settings.resolved_provider != "offline":
        from planner.session.factory import SessionPlanners  # loads the provider SDKs

        sessions = SessionPlanners(planner_settings, adapter=planner.provider)
    if planner_settings.mode == "session" and sessions is None:
        raise SettingError(
            "AMC_PLANNER_MODE",
            "session mode needs a provider that keeps a conversation, and the planner is offline",
            "set AMC_PLANNER_PROVIDER=anthropic or openai (with its API key), or "
            "AMC_PLANNER_MODE=compact",
        )
    budget = budgets or CloudBudgets(store, CloudSettings())
    sink = StoreDecisionSink(store, on_spent=budget.spend.add, on_counted=bus.decisions_counted)
    inner = PlannerServicer(
        caller_host_id=_caller_host_id,
        lease_gate=StoreLeaseGate(store, clock_settled),
        sink=sink,
        planner=planner,
        attempts=StoreAttemptLog(store, handed),
        mode=planner_settings.mode,
        sessions=sessions,
        session_store=lambda: StoreSessionStore(store),
        live_thinking=bus.thinking,
        health=health,
        budget=budget,
        spend=sink,
        call_ledgers=lambda host, task, attempt: StoreCallLedger(
            store, host, task, attempt, on_moved=bus.decisions_counted
        ),
    )
    closeables: list[Any] = [planner] if sessions is None else [planner, sessions]
    provider, model = planner_settings.resolved_provider, planner_settings.resolved_model
    summary = f"{provider} (model {model}, {planner_settings.mode} mode; AMC_PLANNER_* settings)"
    if isinstance(planner.provider, ObservedAdapter):
        summary += f"\n  prices:       {planner.provider.prices.describe(model)}"
    return OwnLeasesOnly(inner, store, provider, model), closeables, summary
