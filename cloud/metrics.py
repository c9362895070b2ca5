"""Every Prometheus metric of a cloud replica, in one registry (`REGISTRY`, served at /metrics).

Labels have bounded values only — a status, a reason, an outcome, a provider, a model — never a
task, lease or host id (hosts are in the fleet page; tasks in the task pages). Each replica keeps
and serves its own: counters count what this replica did; the gauges read from the database
(tasks by status, queue depth, today's spending) are the whole fleet's, the same on every
replica (aggregate them with `max`, not `sum`). docs/operations.md lists them with the alerts
and the dashboard built on them.

Call sites use `current()`, one line each at the narrowest seam (the lease manager and its
batcher, the dispatcher, the sweeper, the Decide service, the model adapter's call, the event
bus). `configure(enabled=False)` swaps in an instance that records nothing, to measure what the
metrics cost (bench/lease_capacity.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cloud.store import spend, states, tasks
from cloud.store.database import Store
from planner.decision import Usage
from planner.errors import PlannerAuthError, PlannerRateLimited, PlannerRejected, PlannerTransient

REGISTRY = CollectorRegistry()

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_DECIDE = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
_DB = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write", "thinking")


class _Off:
    """A metric that records nothing (metrics turned off)."""

    def labels(self, *args: Any, **kwargs: Any) -> _Off:
        return self

    def inc(self, amount: float = 1) -> None:
        return None

    def dec(self, amount: float = 1) -> None:
        return None

    def set(self, value: float) -> None:
        return None

    def observe(self, value: float) -> None:
        return None


def error_class(error: BaseException) -> str:
    """The bounded name of a model call's failure."""
    if isinstance(error, PlannerRateLimited):
        return "rate_limited"
    if isinstance(error, PlannerTransient):
        return "unavailable"
    if isinstance(error, PlannerAuthError):
        return "auth"
    if isinstance(error, PlannerRejected):
        return "rejected"
    return "other"


class CloudMetrics:
    """The metrics; with `registry=None` every one of them records nothing."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.enabled = registry is not None

        def make(kind: Any, name: str, doc: str, labels: tuple[str, ...] = (), **kw: Any) -> Any:
            if registry is None:
                return _Off()
            return kind(name, doc, labels, registry=registry, **kw)

        self.tasks = make(
            Gauge,
            "amc_cloud_tasks",
            "Tasks by status, whole fleet (from the database)",
            ("status",),
        )
        self.queue_depth = make(
            Gauge, "amc_cloud_queue_depth", "Tasks queued for a phone, whole fleet"
        )
        self.submits = make(
            Counter,
            "amc_cloud_task_submits",
            "SubmitTask calls; deduplicated=true when the request id was known",
            ("deduplicated",),
        )
        self.dispatch_latency = make(
            Histogram,
            "amc_cloud_dispatch_latency_seconds",
            "From a task being queued to its assignment being sent to a host",
            buckets=_LATENCY,
        )
        self.lease_streams = make(
            Gauge, "amc_cloud_lease_streams", "Host Lease streams open on this replica"
        )
        self.hello_timeouts = make(
            Counter,
            "amc_cloud_lease_hello_timeouts",
            "Lease streams ended because no valid hello came in time "
            "(AMC_CLOUD_HELLO_TIMEOUT_SECONDS)",
        )
        self.lease_write_timeouts = make(
            Counter,
            "amc_cloud_lease_write_timeouts",
            "Lease streams ended because the host read nothing of them: a write waited "
            "AMC_CLOUD_LEASE_WRITE_TIMEOUT_SECONDS",
        )
        self.renewals = make(
            Counter,
            "amc_cloud_lease_renewals",
            "Lease renewals: outcome=acked, or the reason it was refused",
            ("outcome",),
        )
        self._renewal_outcomes: dict[str, Any] = {}
        self.expiries = make(
            Counter,
            "amc_cloud_lease_expiries",
            "Attempts the sweeper ended: reason=expired (no renewal in time) or deadline_exceeded",
            ("reason",),
        )
        self.requeued = make(
            Counter,
            "amc_cloud_attempts_requeued",
            "Attempts that ended with their task queued again (cause=lease_expired, "
            "retryable_result, or refused: the host declined the assignment)",
            ("cause",),
        )
        self.results = make(
            Counter, "amc_cloud_results", "Task results recorded, by status", ("status",)
        )
        self.decide = make(
            Histogram,
            "amc_cloud_decide_seconds",
            "Decide calls: provider, model and outcome (the gRPC status, ok when decided)",
            ("provider", "model", "outcome"),
            buckets=_DECIDE,
        )
        self.model_calls = make(
            Histogram,
            "amc_cloud_model_call_seconds",
            "Model provider calls (a decision may need several), by provider and model",
            ("provider", "model"),
            buckets=_DECIDE,
        )
        self.provider_errors = make(
            Counter,
            "amc_cloud_provider_errors",
            "Failed model provider calls by class: unavailable, rate_limited, auth, rejected, "
            "other",
            ("provider", "error"),
        )
        self.tokens = make(
            Counter,
            "amc_cloud_model_tokens",
            "Tokens of model calls by provider, model and kind (input, output, cache_read, "
            "cache_write, thinking; thinking is part of output)",
            ("provider", "model", "kind"),
        )
        self.cost = make(
            Counter,
            "amc_cloud_model_cost_usd",
            "What model calls cost in US dollars (list prices, planner/prices.py)",
            ("provider", "model"),
        )
        self.flow_steps_replayed = make(
            Counter,
            "amc_cloud_flow_steps_replayed",
            "Steps Decide answered from a learned flow, with no model call (cloud transport)",
        )
        self.flow_divergences = make(
            Counter,
            "amc_cloud_flow_divergences",
            "Replays of a learned flow that handed over to the model (the screen differed)",
        )
        self.budget_refusals = make(
            Counter,
            "amc_cloud_budget_refusals",
            "Decide calls refused before the model was called: scope=task or fleet_daily",
            ("scope",),
        )
        self.spend_today_usd = make(
            Gauge, "amc_cloud_spend_today_usd", "Fleet model spending today (UTC), US dollars"
        )
        self.tokens_today = make(
            Gauge, "amc_cloud_tokens_today", "Fleet model tokens today (UTC), all kinds billed"
        )
        self.daily_budget_usd = make(
            Gauge, "amc_cloud_daily_budget_usd", "The fleet's daily cost cap (0: none)"
        )
        self.daily_budget_tokens = make(
            Gauge, "amc_cloud_daily_budget_tokens", "The fleet's daily token cap (0: none)"
        )
        self.db_batch = make(
            Histogram,
            "amc_cloud_db_batch_seconds",
            "Renewal batch writes (one transaction each)",
            buckets=_DB,
        )
        self.db_batch_size = make(
            Histogram,
            "amc_cloud_db_batch_renewals",
            "Renewals per batch write",
            buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500),
        )
        self.listen_reconnects = make(
            Counter,
            "amc_cloud_listen_reconnects",
            "PostgreSQL LISTEN connections lost and opened again (replicas' change events)",
        )
        self.notify_failures = make(
            Counter, "amc_cloud_notify_failures", "NOTIFY flushes that failed"
        )
        self.loop_failures = make(
            Counter,
            "amc_cloud_loop_failures",
            "Failed steps of the replica's background loops (dispatch, sweep, ...)",
            ("loop",),
        )
        self.gc_pause = make(
            Histogram,
            "amc_cloud_gc_pause_seconds",
            "Garbage collections (the event loop stands still during each), by generation",
            ("generation",),
            buckets=_DB,
        )
        self.database_clock_offset = make(
            Gauge,
            "amc_cloud_database_clock_offset_seconds",
            "How far this replica's clock is ahead of its PostgreSQL server's (negative: behind),"
            " beyond the round trip's uncertainty; checked every minute",
        )
        self.dispatch_paused = make(
            Gauge,
            "amc_cloud_dispatch_paused",
            "1 while this replica holds new tasks back (the model provider down or refusing the "
            "key, or the fleet's daily budget spent)",
        )

    # ---- one-line call sites ------------------------------------------------------------

    def submitted(self, deduplicated: bool) -> None:
        self.submits.labels(deduplicated="true" if deduplicated else "false").inc()

    def renewal(self, outcome: str, count: int = 1) -> None:
        """`count` renewals ended with `outcome` (the acknowledged ones once per batch stage,
        `RenewalBatcher`: one counter's lock and increment per batch, not per renewal)."""
        # The child is kept: `labels()` on every renewal was a measurable share of its cost.
        child = self._renewal_outcomes.get(outcome)
        if child is None:
            child = self._renewal_outcomes[outcome] = self.renewals.labels(outcome=outcome)
        child.inc(count)

    def renewal_errors(self, count: int) -> None:
        """A renewal batch failed to write (each renewal is told "internal error; retry")."""
        self.renewals.labels(outcome="error").inc(count)

    def result(self, status: str) -> None:
        self.results.labels(status=status.lower()).inc()

    def call_finished(
        self,
        provider: str,
        model: str,
        seconds: float,
        usage: Usage | None,
        error: BaseException | None,
    ) -> None:
        """A model call ended (`planner.vendors.observed.CallObserver`)."""
        self.model_calls.labels(provider=provider, model=model).observe(seconds)
        if error is not None:
            self.provider_errors.labels(provider=provider, error=error_class(error)).inc()
        if usage is None:
            return
        counts = (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens,
            usage.thinking_tokens,
        )
        for kind, count in zip(TOKEN_KINDS, counts, strict=True):
            if count:
                self.tokens.labels(provider=provider, model=model, kind=kind).inc(count)
        if usage.cost_usd:
            self.cost.labels(provider=provider, model=model).inc(usage.cost_usd)

    async def refresh(
        self,
        store: Store,
        daily: spend.DailySpend,
        daily_max_usd: float,
        daily_max_tokens: int,
    ) -> None:
        """Read the fleet-wide gauges from the database (a background loop's step)."""
        if not self.enabled:
            return
        counts = await tasks.count_by_status(store)
        for status in (*states.ACTIVE, *states.TERMINAL):
            self.tasks.labels(status=status.lower()).set(counts.get(status, 0))
        self.queue_depth.set(counts.get(states.QUEUED, 0))
        today = await daily.today(start_of_day(store.now()))
        self.spend_today_usd.set(today.cost_usd)
        self.tokens_today.set(today.billed_tokens)
        self.daily_budget_usd.set(daily_max_usd)
        self.daily_budget_tokens.set(daily_max_tokens)


def start_of_day(now: dt.datetime) -> dt.datetime:
    """Midnight UTC of `now`'s day."""
    return now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)


_ON = CloudMetrics(REGISTRY)
_OFF = CloudMetrics(None)
_current = _ON


def current() -> CloudMetrics:
    """The process's cloud metrics (recording, unless turned off)."""
    return _current


def configure(*, enabled: bool) -> CloudMetrics:
    """Record metrics or not (every replica in the process alike)."""
    global _current
    _current = _ON if enabled else _OFF
    return _current


class _ModelCalls:
    """The model adapter's observer: every call counted in the metrics in force at that time."""

    def call_finished(
        self,
        provider: str,
        model: str,
        seconds: float,
        usage: Usage | None,
        error: BaseException | None,
    ) -> None:
        _current.call_finished(provider, model, seconds, usage, error)


MODEL_CALLS = _ModelCalls()
