"""`amc` as a script uses it (issue 19): full ids and unique prefixes, `--json` on every read
command, exit codes that say how a watched task ended, text printed as written, every user
error one line with a hint (the traceback only with --debug), help with placeholders and
examples, and `amc up`'s context file that a bare `amc task …` finds.

Every command is a new `amc` process against a real cloud over mTLS; hosts are scripted over
the real LeaseService (tests/cloud/cloud_harness.py). Help texts and usage errors, which reach
no cloud, run the installed `amc` script in this process (`amc_here`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import runpy
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf.duration_pb2 import Duration
from sqlalchemy import update

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    lease_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud.pki import ensure_embedded_pki
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from cloud.store import decisions
from cloud.store.models import HostRow
from console import exit_codes
from console.client import OperatorClient, secure_channel
from planner.decision import Decision, ThinkingBlock, Usage
from tests.cloud.cloud_harness import ScriptedHost, channel, renewal, result
from tests.cloud.test_shipping import failed_calls, shipped, unsettled_call
from tests.support.fleet_rows import register

AMC = str(Path(sys.executable).with_name("amc"))
#: An 80-column terminal, and no `amc up` context from the machine running the tests.
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("AMC_")},
    "COLUMNS": "80",
    "AMC_CONTEXT_FILE": "/nonexistent/amc-context.json",
}
HOST = "h1"
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Ran:
    """One finished `amc` process."""

    code: int
    out: str
    err: str


#: `amc` processes `amc_each` runs at once.
AT_ONCE = 4


async def amc(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Ran:
    process = await asyncio.create_subprocess_exec(
        AMC,
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env or ENV,
        cwd=cwd,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    return Ran(process.returncode or 0, out.decode(), err.decode())


async def amc_each(*commands: list[str]) -> list[Ran]:
    """Each command's run, in order, a few at a time: for commands that neither change what
    another reads nor read another's output. Each is a process start and an import (seconds on
    a loaded machine), so one after another they were most of a test's time."""
    gate = asyncio.Semaphore(AT_ONCE)

    async def run(args: list[str]) -> Ran:
        async with gate:
            return await amc(*args)

    return list(await asyncio.gather(*(run(args) for args in commands)))


@dataclass
class Stack:
    """A real cloud, its certificates, and the options that reach it."""

    cloud: CloudServer
    pki: Path
    ops: OperatorClient

    @property
    def conn(self) -> list[str]:
        return ["--cloud", self.cloud.address, "--pki-dir", str(self.pki)]

    async def submit(self, goal: str, host: str = "nobody") -> str:
        response: task_service_pb2.SubmitTaskResponse = await self.ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(goal=goal, target=types_pb2.TaskTarget(host_id=host))
        )
        return response.task.task_id


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    pki = ensure_embedded_pki(tmp_path, [HOST], operator="admin")
    cloud = await build_server(
        CloudSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}",
            listen_address="127.0.0.1:0",
            pki_dir=pki,
            sweep_interval_seconds=0.2,
            dispatch_interval_seconds=0.2,
        )
    )
    await cloud.start()
    ops = OperatorClient.over(
        secure_channel(
            cloud.address,
            ca=pki / "ca.pem",
            cert=pki / "operator-admin.pem",
            key=pki / "operator-admin.key",
        )
    )
    try:
        yield Stack(cloud, pki, ops)
    finally:
        await ops.close()
        await cloud.stop(grace=0)


def one_line(ran: Ran, command: str) -> str:
    """The single stderr line of a failed command, checked to be one line, no traceback."""
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1, ran.err
    assert TRACEBACK not in ran.err
    assert lines[0].startswith(f"{command}: "), lines[0]
    return lines[0]


async def test_ids_are_printed_whole_and_any_unique_prefix_names_a_task(stack: Stack) -> None:
    ids = [await stack.submit(f"Prefix test {i}") for i in range(18)]
    first = ids[0]
    # 18 ids over 16 first digits: some first digit is shared (the ambiguous case).
    shared = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in ids) > 1)
    bad = (("zzz", "'zzz' is not a task id"), ("0" * 31, "no task id starts with"))
    listed, *by_prefix, shown, ambiguous, bad_zzz, bad_zeros = await amc_each(
        [*stack.conn, "task", "list", "--limit", "500"],
        *(
            [*stack.conn, *command, first[:7]]
            for command in (["task", "show"], ["task", "events"], ["decisions"])
        ),
        [*stack.conn, "task", "show", first[:7].upper()],
        [*stack.conn, "task", "show", shared],
        *([*stack.conn, "decisions", b] for b, _ in bad),
    )
    assert listed.code == 0
    for task_id in ids:  # whole, on an 80-column terminal
        assert task_id in listed.out.split()
    for ran in by_prefix:
        assert ran.code == 0, ran.err
    assert first in shown.out
    assert ambiguous.code == exit_codes.USAGE
    line = one_line(ambiguous, "amc task show")
    assert f"task id prefix {shared} is ambiguous: " in line
    assert sum(i in line for i in ids if i.startswith(shared)) >= 2
    assert line.endswith("(give more characters of the id)")
    for ran, (_, words) in zip((bad_zzz, bad_zeros), bad, strict=True):
        assert ran.code == exit_codes.USAGE
        assert words in one_line(ran, "amc decisions")
    cancelled = await amc(*stack.conn, "task", "cancel", first[:9], "--reason", "done testing")
    assert cancelled.code == 0 and cancelled.out.strip() == f"{first}: cancelled"


async def test_every_read_command_speaks_json(stack: Stack) -> None:
    host = ScriptedHost(stack.cloud.address, stack.pki, HOST)
    try:
        await host.connect(["phone-1"])
        task_id = await stack.submit("Turn on dark theme", host=HOST)
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a, 2, "step 2: tap 'Display'"))
        await host.next("renewed")
        await decisions.append(stack.cloud.store, HOST, task_id, 1, _decision("plain"))
        listed, shown, events, logged, hosts = (
            json.loads(ran.out)
            for ran in await amc_each(
                [*stack.conn, "task", "list", "--json"],
                [*stack.conn, "task", "show", task_id[:6], "--json"],
                [*stack.conn, "task", "events", task_id, "--json"],
                [*stack.conn, "decisions", task_id, "--json"],
                [*stack.conn, "host", "list", "--json"],
            )
        )
        assert [t["task_id"] for t in listed["tasks"]] == [task_id]
        assert listed["tasks"][0]["totals"]["decisions"] == 1
        assert shown["task"]["status"] == "running"
        assert shown["task"]["attempts"][0]["renewals"] == 1
        assert [e["kind"] for e in shown["events"]] == ["assigned"]
        assert events["events"] == shown["events"]
        assert logged["decisions"][0]["rationale"] == "plain [e1] :smile:"
        (mine,) = [h for h in hosts["hosts"] if h["host_id"] == HOST]
        assert mine["busy_phones"][0]["task_id"] == task_id
        watching = asyncio.ensure_future(amc(*stack.conn, "task", "watch", task_id, "--json"))
        await host.send(result(a, types_pb2.TASK_STATUS_SUCCEEDED, "Dark theme is on", step=3))
        await host.next("result_ack")
        watched = await watching
        assert watched.code == exit_codes.OK
        lines = [json.loads(line) for line in watched.out.splitlines()]
        assert lines[-1]["task"]["status"] == "succeeded"
        assert all(set(line) == {"task"} for line in lines)
    finally:
        await host.close()


async def test_host_list_says_what_holds_dispatch_in_parts(stack: Stack) -> None:
    """`amc host list` said why dispatch is held in one sentence only, so a script had to parse
    English for the kind of hold, the replica that found it and what lifts it; --json has them
    as fields and the text a line of them under the sentence."""
    health = stack.cloud.provider_health

    async def probe() -> None:
        raise AssertionError("not probed here")

    health.probe = probe  # the offline planner has none: this cloud could not be held
    await health.refused("planner: Anthropic rejected the API key")
    try:
        listed = json.loads((await amc(*stack.conn, "host", "list", "--json")).out)["dispatch"]
        shown = await amc(*stack.conn, "host", "list")
    finally:
        await health.succeeded()
        health.probe = None
    replica = stack.cloud.bus.replica_id
    assert listed["paused"] and listed["reason"].startswith("the model provider refused")
    assert listed["kind"] == "key_refused"
    assert listed["seen_by"] == replica
    assert listed["lifted_by"].startswith("a probe call or a Decide that succeeds, once ")
    assert listed["since"] and listed["next_probe_at"] and listed["resumes_at"] is None
    lines = shown.err.splitlines()
    assert lines[0] == f"dispatch paused: {listed['reason']}"
    assert lines[1].startswith(f"  hold: key_refused · seen by replica {replica} · next probe ")
    assert " · lifted by a probe call or a Decide that succeeds, once " in lines[1]
    cleared = json.loads((await amc(*stack.conn, "host", "list", "--json")).out)["dispatch"]
    assert not cleared["paused"] and cleared["kind"] == "unspecified"


async def test_host_list_says_a_connected_idle_host_was_seen_now(stack: Stack) -> None:
    """`amc host list` printed a host's last message as its "last seen": an idle host sends
    none on its open stream, so a connected, healthy host read "connected · last seen 6m
    ago". A connected host (its stream vouched for every heartbeat) is seen now; once its
    stream is gone, the moment it ended is."""
    host = ScriptedHost(stack.cloud.address, stack.pki, HOST)
    try:
        await host.connect(["phone-1"])
        async with stack.cloud.store.write() as session:
            await session.execute(
                update(HostRow)
                .where(HostRow.host_id == HOST)
                .values(last_seen_at=stack.cloud.store.now() - dt.timedelta(minutes=6))
            )
        shown = await amc(*stack.conn, "host", "list")
        assert f"{HOST} connected · last seen now" in shown.out.splitlines(), shown.out
    finally:
        await host.close()
    for _ in range(600):  # the cloud notices the stream's end
        listed = json.loads((await amc(*stack.conn, "host", "list", "--json")).out)
        if not listed["hosts"][0]["connected"]:
            break
    shown = await amc(*stack.conn, "host", "list")
    assert re.search(rf"^{HOST} disconnected · last seen \d+s ago$", shown.out, re.M), shown.out


async def test_host_list_shows_connected_hosts_first(stack: Stack) -> None:
    """ListHosts pages by id (a key no host changes, so a walk skips and repeats none); `amc
    host list`, which reads every page, still shows the connected hosts first, then by id."""
    made = await register(stack.cloud, 12)
    listed = json.loads((await amc(*stack.conn, "host", "list", "--json")).out)["hosts"]
    shown = [(h["host_id"], h["connected"]) for h in listed]
    assert shown == sorted(made, key=lambda m: (not m[1], m[0]))
    assert shown[:2] == [("fleet-0000", True), ("fleet-0010", True)]


async def test_host_list_says_a_host_is_stopping(stack: Stack) -> None:
    """A host that said it is stopping read "connected" in `amc host list` for the seconds of
    its stop, its phones idle; it reads "stopping" (and `--json` says since when)."""
    host = ScriptedHost(stack.cloud.address, stack.pki, HOST)
    try:
        await host.connect(["phone-1"])
        await host.send(lease_service_pb2.LeaseRequest(stopping=lease_service_pb2.HostStopping()))
        for _ in range(200):  # the cloud records it
            listed = json.loads((await amc(*stack.conn, "host", "list", "--json")).out)
            if listed["hosts"][0]["stopping_since"] is not None:
                break
        shown = await amc(*stack.conn, "host", "list")
        assert f"{HOST} stopping · last seen now" in shown.out.splitlines(), shown.out
    finally:
        await host.close()


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (types_pb2.TASK_STATUS_SUCCEEDED, exit_codes.OK),
        (types_pb2.TASK_STATUS_FAILED, exit_codes.TASK_FAILED),
        (types_pb2.TASK_STATUS_CANCELLED, exit_codes.TASK_CANCELLED),
    ],
)
async def test_watch_exits_with_how_the_task_ended(
    stack: Stack, status: types_pb2.TaskStatus.ValueType, code: int
) -> None:
    host = ScriptedHost(stack.cloud.address, stack.pki, HOST)
    try:
        await host.connect(["phone-1"])
        task_id = await stack.submit("Watch me", host=HOST)
        a = (await host.next("assignment")).assignment
        watching = asyncio.ensure_future(amc(*stack.conn, "task", "watch", task_id[:10]))
        await host.send(renewal(a, 6, "step 6: give up: no such setting"))
        await host.next("renewed")
        await host.send(result(a, status, "ended", step=6))
        await host.next("result_ack")
        watched = await watching
        assert watched.code == code, watched
        # The last line says the step and the task's status apart.
        assert watched.out.splitlines()[-1].startswith(f"{task_id} ")
        if status == types_pb2.TASK_STATUS_FAILED:
            assert "failed last step 6 · action done" in watched.out
            assert "succeeded" not in watched.out
    finally:
        await host.close()


async def test_watch_prints_what_the_task_has_spent_after_each_decision(stack: Stack) -> None:
    """`amc task watch` prints a line for each decision counted, saying the task's decisions,
    tokens (every billed one) and cost so far: nothing else about the task changed, so a line
    without them repeated the one before."""
    host = ScriptedHost(stack.cloud.address, stack.pki, HOST)
    host_ch = channel(stack.cloud.address, stack.pki, f"host-{HOST}")
    watching: asyncio.subprocess.Process | None = None
    try:
        await host.connect(["phone-1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        task_id = await stack.submit("Watch the cost", host=HOST)
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a, 1, "step 1: tap 'Display'"))
        await host.next("renewed")
        watching = await asyncio.create_subprocess_exec(
            AMC,
            *stack.conn,
            *("task", "watch", task_id),
            stdout=subprocess.PIPE,
            env={**ENV, "COLUMNS": "200"},  # one line per change
        )
        assert watching.stdout is not None
        first = await asyncio.wait_for(watching.stdout.readline(), 60)
        assert first.decode().startswith(f"{task_id} running step 1")
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        for n, said in ((1, "1 decision · 2.0k tokens · $0.0125"), (2, "2 decisions · 4.0k")):
            entry = shipped(a, f"d{n}")
            entry.decision.usage.CopyFrom(
                types_pb2.Usage(
                    input_tokens=1200,
                    output_tokens=300,
                    cache_creation_input_tokens=500,
                    cost_usd=0.0125,
                )
            )
            await log.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[entry]))
            line = (await asyncio.wait_for(watching.stdout.readline(), 60)).decode()
            assert line.startswith(f"{task_id} running step 1") and said in line, line
        await host.send(result(a, types_pb2.TASK_STATUS_SUCCEEDED, "done", step=1))
        await host.next("result_ack")
        assert await asyncio.wait_for(watching.wait(), 60) == exit_codes.OK
    finally:
        if watching is not None and watching.returncode is None:
            watching.kill()
            await watching.wait()
        await host.close()
        await host_ch.close()


async def test_watch_prints_a_call_of_unknown_cost_until_it_is_settled(stack: Stack) -> None:
    """`amc task watch` prints a line when a call of unknown cost is recorded (decision 0080:
    here a direct host's, shipped), saying it, and one without it once its late cost settles
    it: nothing else about the task changed."""
    host = ScriptedHost(stack.cloud.address, stack.pki, HOST)
    host_ch = channel(stack.cloud.address, stack.pki, f"host-{HOST}")
    watching: asyncio.subprocess.Process | None = None
    try:
        await host.connect(["phone-1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        submitted: task_service_pb2.SubmitTaskResponse = await stack.ops.tasks.SubmitTask(
            task_service_pb2.SubmitTaskRequest(
                goal="Watch the unknown",
                target=types_pb2.TaskTarget(host_id=HOST),
                lease_duration=Duration(seconds=600),  # no expiry while the CLI starts
            )
        )
        task_id = submitted.task.task_id
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a, 1, "step 1: tap 'Display'"))
        await host.next("renewed")
        watching = await asyncio.create_subprocess_exec(
            AMC,
            *stack.conn,
            *("task", "watch", task_id),
            stdout=subprocess.PIPE,
            env={**ENV, "COLUMNS": "300"},  # one line per change
        )
        assert watching.stdout is not None
        first = await asyncio.wait_for(watching.stdout.readline(), 60)
        assert first.decode().startswith(f"{task_id} running step 1")
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        await log.ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(unsettled_calls=[unsettled_call(a, "c1")])
        )
        line = (await asyncio.wait_for(watching.stdout.readline(), 60)).decode()
        assert "unknown: 1 model call whose cost was never recorded: at most" in line, line
        late = failed_calls(a, "f1")
        late.settles_calls.append("c1")
        await log.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(failed_calls=[late]))
        line = (await asyncio.wait_for(watching.stdout.readline(), 60)).decode()
        assert line.startswith(f"{task_id} running step 1") and "unknown" not in line, line
        await host.send(result(a, types_pb2.TASK_STATUS_SUCCEEDED, "done", step=1))
        await host.next("result_ack")
        assert await asyncio.wait_for(watching.wait(), 60) == exit_codes.OK
    finally:
        if watching is not None and watching.returncode is None:
            watching.kill()
            await watching.wait()
        await host.close()
        await host_ch.close()


def _decision(rationale: str) -> Decision:
    action = types_pb2.Action(purpose="open [e12]", expected_outcome="[/b] shows")
    action.tap.element_id = "e1"
    return Decision(
        tool_name="tap",
        arguments={"element_id": "e1"},
        action=action,
        purpose="open [e12]",
        expected_outcome="[/b] shows",
        rationale=f"{rationale} [e1] :smile:",
        thinking=[ThinkingBlock("[red]no colour[/red]")],
        usage=Usage(input_tokens=10, output_tokens=5),
        provider="anthropic",
        model="claude-test",
        latency_s=0.1,
        forced_retry=False,
        system_prompt="Each element has bounds [left, top, right, bottom] in pixels.\nLine two.",
        user_prompt='Goal:\n"Open [bold]Display[/bold]"\n\tindented \x1b[31mred',
    )


async def test_text_is_printed_as_written_and_prompts_are_readable(stack: Stack) -> None:
    task_id = await stack.submit("Open [bold]Display[/bold] :smile:")
    await decisions.append(stack.cloud.store, HOST, task_id, 1, _decision("Tapped"))
    shown = await amc(*stack.conn, "decisions", task_id, "--prompts")
    assert shown.code == 0, shown.err
    out = shown.out
    assert "Tapped [e1] :smile:" in out and "😄" not in out
    assert "[red]no colour[/red]" in out
    assert "purpose: open [e12]  expected: [/b] shows" in out
    # The prompts as sent: real lines, brackets kept, no JSON escapes.
    assert "Each element has bounds [left, top, right, bottom] in pixels.\nLine two.\n" in out
    assert 'Goal:\n"Open [bold]Display[/bold]"\n\tindented \\x1b[31mred\n' in out
    assert "\x1b" not in out  # a control character is shown, never sent to the terminal
    assert "\\n" not in out
    for command in (["task", "list"], ["task", "show", task_id]):
        ran = await amc(*stack.conn, *command)
        assert "Open [bold]Display[/bold] :smile:" in ran.out


async def test_terminal_commands_in_text_are_shown_never_sent(stack: Stack) -> None:
    """A goal (as any text from the cloud: a host's progress summary quotes an app's labels)
    holding ESC or C1 sequences reached the terminal from `amc task list`/`show`: it retitled,
    recoloured or rewrote the operator's screen. They are written out, as `decisions` does;
    `--json` escapes them too (JSON left DEL and C1 raw) and still parses to the same text."""
    goal = "Open \x1b]0;owned\x07 \x1b[31mred\x1b[0m \x9b2J Display"
    task_id = await stack.submit(goal)
    shown = "Open \\x1b]0;owned \\x1b[31mred\\x1b[0m \\x9b2J Display"  # Rich drops BEL itself
    for command in (["task", "list"], ["task", "show", task_id]):
        ran = await amc(*stack.conn, *command)
        assert ran.code == 0, ran
        assert shown in ran.out, ran.out
        assert "\x1b" not in ran.out and "\x9b" not in ran.out
    ran = await amc(*stack.conn, "task", "show", task_id, "--json")
    assert "\x1b" not in ran.out and "\x9b" not in ran.out and "\\u009b" in ran.out
    assert json.loads(ran.out)["task"]["goal"] == goal


async def test_every_user_error_is_one_line_with_a_hint(stack: Stack, tmp_path: Path) -> None:
    cases = [
        (
            ["--pki-dir", str(tmp_path / "nope"), "task", "list"],
            "amc task list",
            f"no certificate folder {tmp_path / 'nope'} (start the stack with `amc up`",
            exit_codes.USAGE,
        ),
        (
            [*stack.conn, "--operator", "mallory", "task", "list"],
            "amc task list",
            "no certificate for operator 'mallory' in",
            exit_codes.USAGE,
        ),
        (
            [*stack.conn, "task", "list", "--status", "bogus"],
            "amc task list",
            "Invalid value for '--status': 'bogus' is not one of 'queued', 'assigned'",
            exit_codes.USAGE,
        ),
        (
            ["--cloud", f"127.0.0.1:{_free_port()}", "--pki-dir", str(stack.pki), "task", "list"],
            "amc task list",
            "cannot reach the cloud at 127.0.0.1:",
            exit_codes.CLOUD,
        ),
        (
            [*stack.conn, "task", "submit", "x", "--host", "bad host"],
            "amc task submit",
            "the cloud refused the request: target.host_id: 'bad host' is not a host id",
            exit_codes.USAGE,
        ),
        (["certs", "host", str(tmp_path / "no-ca"), "h9"], "amc certs host", "no fleet CA in", 2),
        # Numbers no request can carry were "unexpected ValueError/OverflowError", exit 70.
        (
            [*stack.conn, "task", "submit", "x", "--max-attempts", str(2**31)],
            "amc task submit",
            f"Invalid value for '--max-attempts': {2**31} is out of range",
            exit_codes.USAGE,
        ),
        (
            [*stack.conn, "task", "submit", "x", "--lease-seconds", str(2**63)],
            "amc task submit",
            f"Invalid value for '--lease-seconds': {2**63} is out of range",
            exit_codes.USAGE,
        ),
        (
            [*stack.conn, "task", "submit", "x", "--max-tokens", str(2**63)],
            "amc task submit",
            f"Invalid value for '--max-tokens': {2**63} is out of range",
            exit_codes.USAGE,
        ),
        (
            [*stack.conn, "decisions", "abc", "--attempt", str(2**31)],
            "amc decisions",
            f"Invalid value for '--attempt': {2**31} is out of range",
            exit_codes.USAGE,
        ),
        (  # gRPC dialled the port modulo 65536 (127.0.0.1:34463), and said so only in passing
            ["--cloud", "127.0.0.1:99999", "--pki-dir", str(stack.pki), "task", "list"],
            "amc task list",
            "Invalid value for '--cloud': 127.0.0.1:99999: a port is 0 to 65535",
            exit_codes.USAGE,
        ),
        # Digits of other scripts: "²" was "unexpected ValueError", exit 70; "٣" was dialled.
        (
            ["--cloud", "127.0.0.1:\u00b2", "--pki-dir", str(stack.pki), "task", "list"],
            "amc task list",
            "Invalid value for '--cloud': 127.0.0.1:\u00b2: a port is 0 to 65535",
            exit_codes.USAGE,
        ),
        (
            ["--cloud", "127.0.0.1:\u0663", "--pki-dir", str(stack.pki), "task", "list"],
            "amc task list",
            "Invalid value for '--cloud': 127.0.0.1:\u0663: a port is 0 to 65535",
            exit_codes.USAGE,
        ),
        (
            [*stack.conn, "task", "submit", "x", "--max-attempts", "\uff13"],
            "amc task submit",
            "Invalid value for '--max-attempts'",
            exit_codes.USAGE,
        ),
        (
            ["up", "--console-port", "70000"],
            "amc up",
            "Invalid value for '--console-port'",
            exit_codes.USAGE,
        ),
        (  # a Latin-1 file read into an argument: this was "unexpected UnicodeEncodeError", 70
            [*stack.conn, "task", "submit", "Caf\udce9 au lait"],  # the bytes b"Caf\xe9 au lait"
            "amc task submit",
            "'Caf\\xe9 au lait' is not UTF-8 text",
            exit_codes.USAGE,
        ),
    ]
    results = await amc_each(*(args for args, _, _, _ in cases))
    for (args, command, words, code), ran in zip(cases, results, strict=True):
        assert ran.code == code, (args, ran)
        line = one_line(ran, command)
        assert words in line, line
        assert line.endswith(")"), line  # the hint
    # A secret that is not UTF-8 is named, never quoted (the goal's message quotes its text).
    latin1 = {**ENV, "AMC_SECRET_PIN": "p\udce9ss-1234"}
    args = ["task", "submit", "PIN {{secret:pin}}", "--secret", "pin"]
    refused = await amc(*stack.conn, *args, env=latin1)
    assert refused.code == exit_codes.USAGE, refused
    assert "the value of AMC_SECRET_PIN is not UTF-8 text" in one_line(refused, "amc task submit")
    assert "1234" not in refused.err
    # A date before year 1 was "unexpected OverflowError", exit 70: it is the cloud's limit.
    spent = await amc(*stack.conn, "spend", "--days", "99999999")
    assert spent.code == exit_codes.USAGE, spent
    assert one_line(spent, "amc spend").endswith("since_day..until_day: at most 366 days")
    debugged = await amc("--debug", "--pki-dir", str(tmp_path / "nope"), "task", "list")
    assert debugged.code == exit_codes.USAGE
    assert TRACEBACK in debugged.err
    assert debugged.err.strip().splitlines()[-1].startswith("amc task list: no certificate folder")


async def test_cancelling_an_ended_task_says_its_state_in_words_with_a_hint(stack: Stack) -> None:
    """A second `amc task cancel` printed "task already ended (TASK_STATUS_CANCELLED)": the
    enum's name and no hint. It says the state as `amc task list` does, and what to do."""
    task_id = await stack.submit("Cancel me twice")
    assert (await amc(*stack.conn, "task", "cancel", task_id[:8])).code == exit_codes.OK
    ran = await amc(*stack.conn, "task", "cancel", task_id[:8])
    assert ran.code == exit_codes.USAGE, ran
    assert one_line(ran, "amc task cancel") == (
        f"amc task cancel: task {task_id} already ended: cancelled"
        f" (nothing to cancel; `amc task show {task_id}` says how it ended)"
    )
    assert ran.out == ""


#: The `amc` script (`from console.cli import main; sys.exit(main())`), held at the first import
#: of one module until it is interrupted: a finder says "importing" and sleeps. This is not a
#: stand-in for anything; it only makes "Ctrl-C in the first tenths of a second" a point the
#: test can reach every time, whatever the machine's speed.
HELD_AMC = """
import signal, sys, time
held = sys.argv[1]
# Python's own Ctrl-C handling, as in a terminal (a test run in the background ignores SIGINT).
signal.signal(signal.SIGINT, signal.default_int_handler)
class Hold:
    def find_spec(self, name, path=None, target=None):
        if name == held:
            sys.meta_path.remove(self)
            print("importing", flush=True)
            time.sleep(120)
sys.meta_path.insert(0, Hold())
sys.argv[0:2] = ["amc"]
from console.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize(
    "held",
    [
        "grpc",  # while `console.cli` loads, before `run_main` runs
        "console.gateway.models",  # once `amc task watch` runs (it imports this lazily)
    ],
)
def test_ctrl_c_at_any_point_of_starting_is_exit_130_without_a_traceback(
    held: str, tmp_path: Path
) -> None:
    """Ctrl-C in the first ~0.3 s of `amc task watch` (amc still importing) printed a
    KeyboardInterrupt traceback and the process died of SIGINT (-2); later it was 130."""
    pki = ensure_embedded_pki(tmp_path, [], operator="admin")
    args = ["--pki-dir", str(pki), "task", "watch"]
    process = subprocess.Popen(
        [sys.executable, "-c", HELD_AMC, held, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline() == b"importing\n"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == exit_codes.INTERRUPTED, err.decode()
    assert err.decode() == "" and out == b""


async def test_a_host_without_its_certificate_is_a_usage_error_not_a_bug(tmp_path: Path) -> None:
    """`amc host run` with AMC_HOST_CERTS_DIR naming a folder without the host's files said
    "unexpected CertificateMissing: … (run with --debug for the traceback)", exit 70, the code
    of a bug in amc: it is a setting the person fixes, exit 2, with the command that makes one."""
    env = {**ENV, "AMC_HOST_CERTS_DIR": str(tmp_path / "pki"), "AMC_HOST_HOST_ID": "lab-1"}
    ran = await amc("host", "run", env=env, cwd=tmp_path)
    assert ran.code == exit_codes.USAGE, ran
    assert one_line(ran, "amc host run") == (
        f"amc host run: CA certificate {tmp_path / 'pki' / 'ca.pem'} does not exist"
        " (make one with `amc certs host DIR HOST_ID`)"
    )


async def test_export_into_a_folder_writes_the_default_name_there(
    stack: Stack, tmp_path: Path
) -> None:
    """`-o exports/` (a folder that exists) files the zip away under its usual name; a folder
    that is not there is one line and exit 2. Both used to be "unexpected" errors (exit 70)."""
    task_id = await stack.submit("Export me: héllo 日本語")
    folder = tmp_path / "exports"
    folder.mkdir()
    ran = await amc(*stack.conn, "task", "export", task_id[:8], "-o", str(folder))
    assert ran.code == exit_codes.OK, ran
    written = folder / f"amc-export-{task_id}.zip"
    assert ran.out.startswith(f"{written} (0 steps"), ran.out
    assert written.is_file() and [p.name for p in folder.iterdir()] == [written.name]
    missing = tmp_path / "nowhere" / "x.zip"
    ran = await amc(*stack.conn, "task", "export", task_id, "-o", str(missing))
    assert ran.code == exit_codes.USAGE, ran
    assert f"no folder {missing.parent}" in one_line(ran, "amc task export")
    assert ran.out == "" and not missing.parent.exists()


@pytest.mark.parametrize("json_out", [False, True])
async def test_a_reader_that_stops_reading_is_exit_141_not_a_failed_task(
    stack: Stack, json_out: bool
) -> None:
    """`amc … | head -1`: the pipe closes under amc. Rich's handling exited 1, the code that says
    a watched task failed; it is 141 (128 + SIGPIPE, as a shell says it), with no traceback."""
    for i in range(3):
        await stack.submit(f"Pipe test {i}")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before amc writes
    try:
        process = await asyncio.create_subprocess_exec(
            AMC,
            *stack.conn,
            "task",
            "list",
            *(["--json"] if json_out else []),
            stdout=write,
            stderr=subprocess.PIPE,
            env=ENV,
        )
    finally:
        os.close(write)
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == exit_codes.BROKEN_PIPE, err.decode()
    assert TRACEBACK not in err.decode() and "Exception ignored" not in err.decode()


async def test_an_unknown_host_is_a_warning_on_stderr_and_the_id_stays_alone_on_stdout(
    stack: Stack,
) -> None:
    ran = await amc(*stack.conn, "task", "submit", "Somewhere", "--host", "lab-9")
    assert ran.code == 0
    assert re.fullmatch(r"[0-9a-f]{32}\n", ran.out)
    assert ran.err.startswith("warning: host lab-9 has never connected to this cloud")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


COMMANDS = [
    [],
    ["demo"],
    ["up"],
    ["decisions"],
    ["cloud", "serve"],
    ["host"],
    ["host", "run"],
    ["host", "token"],
    ["host", "list"],
    ["host", "export"],
    ["console", "serve"],
    ["certs", "init"],
    ["certs", "host"],
    ["certs", "operator"],
    ["certs", "viewer"],
    ["task"],
    ["task", "submit"],
    ["task", "list"],
    ["task", "show"],
    ["task", "events"],
    ["task", "watch"],
    ["task", "cancel"],
    ["task", "retry"],
    ["task", "export"],
    ["flows"],
    ["flows", "list"],
    ["flows", "show"],
    ["flows", "disable"],
    ["flows", "enable"],
    ["spend"],
    ["certs", "revoke"],
    ["certs", "unrevoke"],
]


def amc_here(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Ran:
    """`amc ARGS` run in this process: the installed `amc` script itself (runpy runs it as
    `__main__`, so click names the program from it as in a process of its own), with `ENV`'s
    variables. Help and usage errors never reach a cloud, and a process of their own cost
    about 0.9 s each, 54 of them; `test_amc_here_prints_what_the_amc_process_prints` shows
    the two ways print the same."""
    for key in [key for key in os.environ if key.startswith("AMC_")]:
        monkeypatch.delenv(key)
    for key, value in ENV.items():
        if key.startswith("AMC_") or key == "COLUMNS":
            monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", [AMC, *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(AMC, run_name="__main__")
    code = exited.value.code
    assert isinstance(code, int), code
    captured = capsys.readouterr()
    return Ran(code, captured.out, captured.err)


async def test_amc_here_prints_what_the_amc_process_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The in-process runs above stand for real `amc` processes: a usage error and a help text
    are the same code, stdout and stderr both ways (and the installed entry point runs)."""
    commands = [["flows", "disable", "--no-such-option"], ["task", "submit", "--help"]]
    processes = await amc_each(*commands)
    for args, process in zip(commands, processes, strict=True):
        assert amc_here(args, monkeypatch, capsys) == process
    assert processes[0].code == exit_codes.USAGE and processes[1].out.startswith("Usage: amc")


@pytest.mark.parametrize("command", [c for c in COMMANDS if len(c) == 2], ids=lambda c: " ".join(c))
def test_an_error_names_the_whole_command_of_every_group(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error line's prefix comes from a list of the command groups kept by hand, which
    lacked `flows`: `amc flows disable 9c2e` with a typo said "amc flows: flow 9c2x not
    found", a script's log not saying which of list, show, disable or enable failed."""
    ran = amc_here([*command, "--no-such-option"], monkeypatch, capsys)
    assert ran.code == exit_codes.USAGE, ran.err
    assert ran.err.startswith(f"amc {' '.join(command)}: No such option"), ran.err


def test_an_unknown_option_before_the_command_is_named_as_amc_s(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The prefix skipped the values of the options it knew only: an unknown one taking a
    value made that value read as the command (`amc --certs pki task list` said "amc pki: No
    such option: --certs"). Click's own context says which command refused it."""
    ran = amc_here(
        ["--cloud", "127.0.0.1:1", "--certs", "pki", "task", "list"], monkeypatch, capsys
    )
    assert ran.code == exit_codes.USAGE, ran.err
    assert ran.err.startswith("amc: No such option: --certs"), ran.err


@pytest.mark.parametrize(
    "args",
    [
        ["task", "list", "--limit", "1_0"],
        ["task", "list", "--limit", "+3"],
        ["task", "list", "--limit", "3.0"],
        ["task", "submit", "Open Settings", "--max-attempts", "1_0"],
        ["decisions", "t-1", "--attempt", "1.0"],
    ],
)
def test_whole_number_options_are_written_in_digits_only(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Options taking a whole number read "1_0" as 10, "+3" as 3 and "3.0" as 3 (pydantic's lax
    mode under Typer), so a typo went to the cloud as a number nobody wrote (ten attempts).
    They now take digits only: a usage error (exit 2) naming the option, before any call."""
    ran = amc_here(["--cloud", "127.0.0.1:1", *args], monkeypatch, capsys)
    assert ran.code == 2, ran.out + ran.err
    assert args[-2] in ran.err and "whole number" in ran.err, ran.err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "amc")
def test_help_shows_placeholders_and_examples(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = amc_here([*command, "--help"], monkeypatch, capsys)
    assert ran.code == 0, ran.err
    assert ran.out.startswith("Usage: amc")
    assert not re.search(
        r"<(str|int|bool|float|path|list\[[a-z]+\]|int range|float range)>", ran.out
    ), ran.out
    if (len(command) == 2 and command[0] in ("task", "certs", "flows")) or command in (
        ["demo"],
        ["spend"],
        ["up"],
        ["decisions"],
        ["host", "token"],
        ["host", "list"],
    ):
        assert "Examples:" in ran.out
    # The cloud's export carries the screenshots hosts shipped to it (it said it had none).
    assert "has no screenshots" not in ran.out


async def test_amc_up_leaves_a_context_that_bare_commands_find(tmp_path: Path) -> None:
    """`amc up` with the cloud's default port taken falls back to a free one; a bare `amc task
    submit`/`list` (no --cloud, no --pki-dir) reaches it through the context file; `amc host
    token` prints a login link that works once; Ctrl-C removes the context. A fresh database's
    migrations are one line of ours (alembic's own line per migration was 25 lines of noise)."""
    state = tmp_path / "state"
    env = {**ENV, "XDG_STATE_HOME": str(state)}
    env.pop("AMC_CONTEXT_FILE")
    context_file = state / "amc" / "context.json"
    up = await asyncio.create_subprocess_exec(
        AMC,
        "up",
        "--console-port",
        "0",
        "--host-console-port",
        "0",
        "--phones",
        "1",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    assert up.stdout is not None
    seen: list[str] = []
    try:
        while not any(line.startswith("operator:") for line in seen):
            line = (await asyncio.wait_for(up.stdout.readline(), 120)).decode()
            assert line, "".join(seen)
            seen.append(line)
        assert context_file.exists()
        # A fresh database's migrations are one line, not one line each (alembic's own).
        assert not any("alembic" in line for line in seen), "".join(seen)
        assert any("database schema upgraded from empty to 00" in line for line in seen)
        written = json.loads(context_file.read_text())
        assert written["pid"] == up.pid and written["operator"] == "admin"

        submitted = await amc("task", "submit", "Turn on dark theme", env=env, cwd=state)
        assert submitted.code == 0, submitted
        task_id = submitted.out.strip()
        listed = await amc("task", "list", env=env, cwd=state)
        assert listed.code == 0 and task_id in listed.out

        token = await amc("host", "token", env=env, cwd=state)
        assert token.code == 0, token
        login_url = token.out.strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/login\?token=\S+", login_url), login_url
        assert _logs_in(login_url) and not _logs_in(login_url)  # once only
    finally:
        with contextlib.suppress(ProcessLookupError):
            up.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(up.stdout.read(), 60)
        await asyncio.wait_for(up.wait(), 60)
    assert up.returncode in (0, exit_codes.INTERRUPTED), "".join(seen) + rest.decode()
    assert TRACEBACK not in rest.decode()
    assert not context_file.exists()
    after = await amc("task", "list", env=env, cwd=state)
    assert after.code == exit_codes.USAGE
    assert "no `amc up` is running here" in one_line(after, "amc task list")


def _logs_in(login_url: str) -> bool:
    """Log in to the host console with the link's token (the form and its CSRF token)."""
    base, token = login_url.split("/login?token=")
    with httpx.Client(base_url=base, follow_redirects=False, timeout=20) as browser:
        form = browser.get(f"/login?token={token}").text
        match = re.search(r'name="csrf_token" value="([^"]+)"', form)
        assert match, form
        sent = browser.post(
            "/login", data={"csrf_token": match.group(1), "token": token, "next": "/now"}
        )
        return sent.status_code == 303


async def test_amc_up_refuses_a_taken_console_port_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**ENV, "XDG_STATE_HOME": str(tmp_path / "state")}
        ran = await amc("up", "--console-port", str(port), env=env, cwd=tmp_path)
    assert ran.code == exit_codes.USAGE
    assert ran.out == ""  # no banner
    line = one_line(ran, "amc up")
    assert f"the operators' console cannot listen on 127.0.0.1:{port}" in line
    assert line.endswith("(pick another port with --console-port PORT, or stop what uses it)")
    assert not (tmp_path / "state" / "amc" / "context.json").exists()


async def test_amc_up_names_its_listen_option_for_an_address_the_cloud_refuses(
    tmp_path: Path,
) -> None:
    """A taken or impossible `--listen` is said as `--listen`: it was said as the
    AMC_CLOUD_LISTEN_ADDRESS the stack passes it on as ("fix the variable or unset it")."""
    env = {**ENV, "XDG_STATE_HOME": str(tmp_path / "state")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for address, problem in (
            (f"127.0.0.1:{port}", f"cannot listen on 127.0.0.1:{port}"),
            ("127.0.0.1:99999", "port 99999 is out of range"),
        ):
            ran = await amc(
                "up",
                "--data-dir",
                str(tmp_path / "data"),
                "--console-port",
                "0",
                "--host-console-port",
                "0",
                "--listen",
                address,
                env=env,
                cwd=tmp_path,
            )
            assert ran.code == exit_codes.USAGE, ran
            line = one_line(ran, "amc up")
            assert line.startswith(f"amc up: --listen {address}: {problem}"), line
            assert "AMC_CLOUD_LISTEN_ADDRESS" not in line and "variable" not in line, line
            assert line.endswith("with --listen HOST:PORT, or leave --listen out for the default)")
    assert not (tmp_path / "state" / "amc" / "context.json").exists()


async def test_session_mode_on_the_offline_planner_is_refused_at_start_in_one_line(
    tmp_path: Path,
) -> None:
    """The issue: such a stack "starts without a word and fails every task at step 1"."""
    env = {**ENV, "AMC_PLANNER_MODE": "session", "XDG_STATE_HOME": str(tmp_path / "state")}
    for command in (["demo"], ["up", "--console-port", "0", "--host-console-port", "0"]):
        ran = await amc(*command, "--data-dir", str(tmp_path / "data"), env=env, cwd=tmp_path)
        assert ran.code == exit_codes.USAGE, ran
        line = one_line(ran, f"amc {command[0]}")
        assert "AMC_PLANNER_MODE: session mode needs a provider that keeps a conversation" in line
        assert ran.out == ""
