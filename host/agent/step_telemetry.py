"""What one attempt's steps tell the operators: a trace span, metrics and log fields per step.

The agent loop marks where a step starts, its phases (perceive, plan, act, record) and its end;
this turns those marks into:
- a `step` span (attributes: task, attempt, step, host, then the decision's model and tokens)
  with a child span per phase. The step span is made *current* for the whole step, so the
  Decide call the plan phase makes is its child and carries the trace to the cloud;
- `amc_host_step_seconds`, `amc_host_step_phase_seconds{phase}`, `amc_host_steps{outcome}`;
- the task, attempt, host and step bound to every log line of the attempt (`telemetry.logs`).

A step span is entered by attaching it to the current context and left by detaching it: the
loop's body stays as it is (no block around it), and a step that ends by an exception is closed
by `close()`, which the loop calls whatever happened.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from host import metrics
from planner.decision import Decision
from telemetry import logs, tracing

LogToken = contextvars.Token[Mapping[str, object]]


class StepTelemetry:
    """Spans, metrics and log fields of one attempt (make one per attempt run)."""

    def __init__(self, task_id: str, attempt: int, host_id: str | None) -> None:
        self._attrs: dict[str, str | int] = {"amc.task_id": task_id, "amc.attempt": attempt}
        if host_id:
            self._attrs["amc.host_id"] = host_id
        self._attempt_log = logs.bind(task_id=task_id, attempt=attempt, host_id=host_id)
        self._span: trace.Span | None = None
        self._span_token: object | None = None
        self._step_log: LogToken | None = None
        self._started = 0.0

    def start_step(self, step: int) -> None:
        """A new step begins (the previous one, if still open, ends unfinished)."""
        self._end_step(None)
        self._step_log = logs.bind(step=step)
        self._span = tracing.tracer().start_span(
            "step", attributes={**self._attrs, "amc.step": step}
        )
        self._span_token = otel_context.attach(trace.set_span_in_context(self._span))
        self._started = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A phase of the current step: its own span and duration."""
        started = time.perf_counter()
        try:
            with tracing.span(name):
                yield
        finally:
            metrics.phase_seconds.labels(phase=name).observe(time.perf_counter() - started)

    def decided(self, decision: Decision) -> None:
        """The step's decision: model and tokens on the step span."""
        u = decision.usage
        if self._span is not None:
            tracing.set_attributes(
                self._span,
                {
                    "gen_ai.system": decision.provider,
                    "gen_ai.response.model": decision.model,
                    "gen_ai.usage.input_tokens": u.input_tokens,
                    "gen_ai.usage.output_tokens": u.output_tokens,
                    "amc.usage.cost_usd": u.cost_usd,
                    "amc.tool": decision.tool_name,
                },
            )

    def end_step(self, ok: bool) -> None:
        """The step finished: its action ran (`ok`) or failed."""
        metrics.steps.labels(outcome="succeeded" if ok else "failed").inc()
        metrics.step_seconds.observe(time.perf_counter() - self._started)
        self._end_step(ok)

    def _end_step(self, ok: bool | None, error: BaseException | None = None) -> None:
        if self._span is not None:
            if error is not None:
                self._span.record_exception(error)
                self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            elif ok is False:
                self._span.set_status(Status(StatusCode.ERROR, "the action failed"))
            self._span.end()
            self._span = None
        if self._span_token is not None:
            otel_context.detach(self._span_token)  # type: ignore[arg-type]  # attach's token
            self._span_token = None
        if self._step_log is not None:
            logs.unbind(self._step_log)
            self._step_log = None

    def fail(self, error: BaseException) -> None:
        """An exception ends the attempt: the open step ends with it."""
        self._end_step(None, error)

    def close(self, outcome: str) -> None:
        """The attempt ended (`outcome`: succeeded, failed, cancelled): close what is open and
        unbind the attempt's log fields."""
        self._end_step(None)
        metrics.attempts.labels(outcome=outcome).inc()
        logs.unbind(self._attempt_log)
