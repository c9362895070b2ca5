"""docs/deployment.md's "A phone lost during an attempt" is what an operator reads about an
attempt whose phone leaves adb: it must say the outcomes the host now gives (decision 0087)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_deployment_guide_names_the_unsteady_and_adb_server_outcomes() -> None:
    """It said a phone back within every grace went on "as if nothing happened" and that the
    Node host "does the same", with no word of "phone unsteady" (the fourth drop) or
    "adb server unreachable": both untrue since decision 0087."""
    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    section = text.split("## A phone lost during an attempt", 1)[1].split("\n## ", 1)[0]
    assert "phone unsteady" in section
    assert "adb server unreachable" in section
    assert "0087" in section
