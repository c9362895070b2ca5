"""Figures of one benchmark: named rows with a value, an optional same-run baseline and their ratio.

Every benchmark returns a `Section`; the runner prints it and renders it into docs/benchmarks.md.
Ratios, not absolute times, are what to compare across machines: these machines are noisy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN when there are no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(value: float, baseline: float) -> float:
    """value / baseline, NaN when the baseline is zero or missing."""
    if not baseline or math.isnan(baseline) or math.isnan(value):
        return math.nan
    return value / baseline


def fmt(value: float | int | str | None, digits: int = 3) -> str:
    """A compact human number: thousands separators, a few significant digits."""
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 100):
        return f"{int(value):,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.{digits}g}"


@dataclass(slots=True)
class Row:
    """One figure: ours, the baseline it is compared with, and what the baseline is."""

    metric: str
    value: float | int | str
    unit: str = ""
    baseline: float | int | None = None
    baseline_name: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or isinstance(self.value, str):
            return None
        return ratio(float(self.value), float(self.baseline))


@dataclass(slots=True)
class Section:
    """The figures of one benchmark at one size."""

    name: str
    title: str
    size: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: str = ""
    seconds: float = 0.0

    def add(
        self,
        metric: str,
        value: float | int | str,
        unit: str = "",
        *,
        baseline: float | int | None = None,
        baseline_name: str = "",
        note: str = "",
    ) -> Row:
        row = Row(metric, value, unit, baseline, baseline_name, note)
        self.rows.append(row)
        return row

    def text(self) -> str:
        """Plain-text table for the terminal."""
        lines = [f"== {self.title} [{self.size}] ({self.seconds:.1f} s)"]
        width = max((len(r.metric) for r in self.rows), default=10)
        for r in self.rows:
            value = f"{fmt(r.value)} {r.unit}".strip()
            line = f"  {r.metric:<{width}}  {value:>18}"
            if r.baseline is not None:
                line += f"   vs {r.baseline_name} {fmt(r.baseline)} = x{fmt(r.ratio)}"
            if r.note:
                line += f"   ({r.note})"
            lines.append(line)
        lines.extend(f"  * {n}" for n in self.notes)
        if self.raw:
            lines.append(self.raw.rstrip())
        return "\n".join(lines)

    def markdown(self) -> str:
        """Markdown table for docs/benchmarks.md."""
        out = [f"### {self.title}", "", f"Size: {self.size}. Wall time {self.seconds:.0f} s.", ""]
        if self.rows:
            out += [
                "| metric | value | baseline (same run) | ratio | note |",
                "|---|---:|---|---:|---|",
            ]
            for r in self.rows:
                base = f"{r.baseline_name}: {fmt(r.baseline)}" if r.baseline is not None else ""
                ratio_text = f"×{fmt(r.ratio)}" if r.ratio is not None else ""
                value = f"{fmt(r.value)} {r.unit}".strip()
                out.append(f"| {r.metric} | {value} | {base} | {ratio_text} | {r.note} |")
            out.append("")
        out += [f"- {n}" for n in self.notes]
        if self.notes:
            out.append("")
        if self.raw:
            out += ["```", self.raw.rstrip(), "```", ""]
        return "\n".join(out)
