"""The report: one self-contained HTML file (inline CSS, images as data URIs, no script, no
request of any kind) that a person can attach to a bug report and open anywhere."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from export.overlay import annotated, base_image, encode
from export.run import Run, Step
from planner.decision import OMITTED_BLOCK, Usage, thinking_word
from planner.describe import describe
from planner.unsettled import unsettled_words

_ENV = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
#: Calls of unknown cost in the words both consoles and the CLI use (decision 0080): the
#: report had a third phrasing of its own.
_ENV.globals["unsettled_words"] = unsettled_words


def data_uri(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")


@dataclass(slots=True)
class StepView:
    """What the template shows of one step."""

    step: Step
    anchor: str
    what: str
    before: str
    after: str | None
    thinking_word: str
    tokens: int | None
    #: The system prompt, shown where it differs from the one before it in the same attempt
    #: (it usually is one per attempt; repeating tens of KB per step would bury the steps).
    system_prompt: str


def _tokens(usage: Usage | None) -> int | None:
    return None if usage is None else usage.input_tokens + usage.output_tokens


def step_view(step: Step, previous: Step | None = None) -> StepView:
    before = data_uri(encode(annotated(step)))
    after = None
    if step.after_png and step.after_png != step.before_png:
        after = data_uri(encode(base_image(step, "after")))
    return StepView(
        step=step,
        anchor=f"a{step.attempt}-s{step.step_index}",
        what=describe(step.action, step.screen),
        before=before,
        after=after,
        thinking_word=thinking_word(step.thinking_kind),
        tokens=_tokens(step.usage),
        system_prompt=""
        if previous is not None
        and previous.attempt == step.attempt
        and previous.system_prompt == step.system_prompt
        else step.system_prompt,
    )


def render_report(run: Run) -> str:
    """The whole report as one HTML document."""
    views = [step_view(s, run.steps[i - 1] if i else None) for i, s in enumerate(run.steps)]
    has_usage = (
        any(s.usage is not None for s in run.steps)
        or bool(run.failed_calls)
        or run.pruned is not None
    )
    usage, cost = run.total()  # the failed decisions' billed calls too: the task's totals
    latencies = [s.latency_s for s in run.steps if s.latency_s is not None]
    totals = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "latency_s": sum(latencies) if latencies else None,
        "cost_usd": cost if run.steps or run.failed_calls or run.pruned else None,
    }
    template = _ENV.get_template("report.html")
    return template.render(
        run=run, steps=views, totals=totals, omitted_block=OMITTED_BLOCK, has_usage=has_usage
    )
