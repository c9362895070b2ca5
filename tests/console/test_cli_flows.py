"""`amc flows …`, `amc task submit --no-replay` and the verdicts in `amc decisions`, as an
operator runs them: a new process per command against a real cloud server over mTLS."""

from __future__ import annotations

import json
from pathlib import Path

from amc.v1 import types_pb2
from cloud.store import decisions, tasks
from planner.decision import Decision, Usage
from planner.tools import Judgement
from tests.console.test_cli import amc, cli_cloud
from tests.support.flows import store_flow


async def test_flows_commands_and_verdicts(tmp_path: Path) -> None:
    async with cli_cloud(tmp_path) as (cloud, conn):
        code, empty = await amc(*conn, "flows", "list")
        assert code == 0 and "no flows learned yet" in empty
        row = await store_flow(cloud.store)
        code, listing = await amc(*conn, "flows", "list")
        assert code == 0 and row.flow_id in listing and "Turn on dark theme" in listing
        code, shown = await amc(*conn, "flows", "show", row.flow_id)
        assert code == 0, shown
        code, by_prefix = await amc(*conn, "flows", "show", row.flow_id[:6], "--json")
        assert code == 0, by_prefix
        assert json.loads(by_prefix)["flow_id"] == row.flow_id  # a unique prefix, as JSON
        code, listed = await amc(*conn, "flows", "list", "--json")
        assert code == 0 and [f["flow_id"] for f in json.loads(listed)["flows"]] == [row.flow_id]
        code, bogus = await amc(*conn, "flows", "list", "--status", "bogus")
        assert code == 2 and "'bogus' is not one of" in bogus
        assert "3. tap on" in shown and "'Dark theme'" in shown
        assert "expected: the 'Dark theme' switch is on" in shown
        code, off = await amc(*conn, "flows", "disable", row.flow_id, "--reason", "moved [x]")
        assert code == 0 and "disabled (disabled by operator admin: moved [x])" in off
        code, listing = await amc(*conn, "flows", "list", "--status", "active")
        assert row.flow_id not in listing
        code, on = await amc(*conn, "flows", "enable", row.flow_id)
        assert code == 0 and f"{row.flow_id}: active" in on
        code, missing = await amc(*conn, "flows", "show", "nope")
        assert code != 0 and "flow nope not found" in missing and "amc flows list" in missing

        code, out = await amc(*conn, "task", "submit", "Open Display", "--no-replay")
        assert code == 0, out
        task_id = out.strip()
        view = await tasks.get(cloud.store, task_id)
        assert view is not None and view.task.no_replay

        action = types_pb2.Action(purpose="open it", expected_outcome="the 'Display' page is open")
        action.tap.element_id = "e2"
        decision = Decision(
            tool_name="tap",
            arguments={"element_id": "e2"},
            action=action,
            purpose="open it",
            expected_outcome="the 'Display' page is open",
            rationale="r",
            thinking=[],
            usage=Usage(),
            provider="offline",
            model="m",
            latency_s=0.0,
            forced_retry=False,
            system_prompt="s",
            user_prompt="u",
        )
        await decisions.append(cloud.store, "h1", task_id, 1, decision)
        await decisions.record_outcome(
            cloud.store,
            task_id,
            1,
            types_pb2.ActionOutcome(
                step_index=1,
                executed=True,
                verdict=types_pb2.VERDICT_NOT_MET,
                evidence="looked for the 'Display' page: the screen shows 'Settings'",
            ),
        )
        await decisions.record_judgement(cloud.store, task_id, 1, 1, Judgement("met", "[b]ok"))
        code, printed = await amc(*conn, "decisions", task_id)
        assert code == 0, printed
        assert "verified steps: 0 met · 1 not met · 0 unknown" in printed
        assert "not met (checker: looked for the 'Display' page: the screen shows 'Settings')" in (
            printed
        )
        assert "model says met: [b]ok" in printed and "checker and model disagree" in printed


async def test_an_empty_flow_id_is_refused_as_an_empty_task_id_is(tmp_path: Path) -> None:
    """Every flow id starts with '': `amc flows show ''` printed "flow  not found" without
    flows, showed the only flow when there was one, and `amc flows disable ''` disabled it.
    The empty id (or blanks) is refused before any call, as the task commands refuse it."""
    async with cli_cloud(tmp_path) as (cloud, conn):
        code, none = await amc(*conn, "flows", "show", "")
        assert code == 2 and "'' is not a flow id" in none, none
        row = await store_flow(cloud.store)
        for command in (["show", ""], ["show", "  "], ["disable", "", "--reason", "r"]):
            code, refused = await amc(*conn, "flows", *command)
            assert code == 2 and "is not a flow id" in refused, refused
            assert "amc flows list" in refused
        code, listing = await amc(*conn, "flows", "list", "--status", "active", "--json")
        assert code == 0 and [f["flow_id"] for f in json.loads(listing)["flows"]] == [row.flow_id]
