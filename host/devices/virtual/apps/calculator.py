"""Calculator: a keypad, a formula line and a result line, with operator precedence."""

from __future__ import annotations

import re
from fractions import Fraction
from functools import partial

from host.devices.virtual.apps.base import App, PhoneApi
from host.devices.virtual.layout import Node
from host.devices.virtual.state import Page
from host.devices.virtual.widgets import PAD, Geometry, button, text

PKG = "com.android.calculator2"
# (label, resource id, content-desc); the font has no ×/÷ glyphs, so ASCII operators are drawn.
KEYS = [
    [
        ("AC", "clr", "clear"),
        ("DEL", "del", "delete"),
        ("%", "op_pct", "percent"),
        ("/", "op_div", "divide"),
    ],
    [("7", "digit_7", ""), ("8", "digit_8", ""), ("9", "digit_9", ""), ("*", "op_mul", "multiply")],
    [("4", "digit_4", ""), ("5", "digit_5", ""), ("6", "digit_6", ""), ("-", "op_sub", "minus")],
    [("1", "digit_1", ""), ("2", "digit_2", ""), ("3", "digit_3", ""), ("+", "op_add", "plus")],
    [("0", "digit_0", ""), (".", "dec_point", "point"), ("=", "eq", "equals")],
]
OPERATORS = "+-*/"
_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|[-+*/%]")


def evaluate(expression: str) -> str:
    """Evaluate `a op b op c…` with * and / before + and -, exactly (fractions), or raise."""
    tokens = _TOKEN.findall(expression)
    if "".join(tokens) != expression or not tokens:
        raise ValueError(expression)
    values: list[Fraction] = []
    ops: list[str] = []
    expect_number = True
    for tok in tokens:
        if expect_number:
            if tok in OPERATORS or tok == "%":
                raise ValueError(expression)
            values.append(Fraction(tok))
            expect_number = False
        elif tok == "%":
            values[-1] /= 100
        else:
            while ops and (ops[-1] in "*/" or tok in "+-"):
                _apply(values, ops.pop())
            ops.append(tok)
            expect_number = True
    if expect_number:
        raise ValueError(expression)
    while ops:
        _apply(values, ops.pop())
    return _format(values[0])


def _apply(values: list[Fraction], op: str) -> None:
    b = values.pop()
    a = values.pop()
    if op == "/" and b == 0:
        raise ZeroDivisionError
    values.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op])


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10g}"


class CalculatorApp(App):
    package = PKG
    label = "Calculator"
    activity = "com.android.calculator2.Calculator"
    icon_color = (234, 134, 0)

    def build(self, phone: PhoneApi, page: Page, geo: Geometry) -> list[Node]:
        del page
        w = geo.width
        state = phone.state
        display_h = 700
        top = geo.top
        formula = text(
            (PAD, top + 120, w - PAD, top + 320),
            state.calc_expression,
            rid=f"{PKG}:id/formula",
            size=96,
            align="right",
        )
        result = text(
            (PAD, top + 360, w - PAD, top + 520),
            state.calc_result,
            rid=f"{PKG}:id/result",
            size=72,
            align="right",
            role="secondary",
        )
        display = Node(
            "android.view.ViewGroup", (0, top, w, top + display_h), resource_id=f"{PKG}:id/display"
        )
        display.add(formula, result)
        pad = Node(
            "android.view.ViewGroup",
            (0, top + display_h, w, geo.bottom),
            resource_id=f"{PKG}:id/pad_numeric",
        )
        rows = len(KEYS)
        kh = (geo.bottom - top - display_h) // rows
        kw = w // 4
        for r, keys in enumerate(KEYS):
            y = top + display_h + r * kh
            x = 0
            for label, rid, desc in keys:
                span = 2 if label == "=" else 1
                node = button(
                    (x + 12, y + 12, x + span * kw - 12, y + kh - 12),
                    label,
                    f"{PKG}:id/{rid}",
                    partial(self._press, phone, label),
                    role="key",
                )
                node.content_desc = phone.strings.tr(desc) if desc else ""
                node.font_size = 64
                pad.add(node)
                x += span * kw
        return [display, pad]

    def _press(self, phone: PhoneApi, key: str) -> None:
        s = phone.state
        if key == "AC":
            s.calc_expression, s.calc_result = "", ""
        elif key == "DEL":
            s.calc_expression = s.calc_expression[:-1]
        elif key == "=":
            try:
                s.calc_result = evaluate(s.calc_expression)
            except ZeroDivisionError:
                s.calc_result = phone.strings.tr("Can't divide by 0")
            except (ValueError, IndexError):
                s.calc_result = phone.strings.tr("Bad expression")
        else:
            if s.calc_result:
                done = s.calc_result
                s.calc_result = ""
                if key in OPERATORS and not any(c.isalpha() for c in done):
                    s.calc_expression = done
                else:
                    s.calc_expression = ""
            s.calc_expression += key
