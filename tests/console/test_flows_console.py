"""The operators' console and flows: the flows pages (list, steps, disable/enable with CSRF),
the API, "no replay" on the submit form, and verdict badges with the counts on a task page."""

from __future__ import annotations

import io
import re
import uuid
import zipfile
from html import unescape
from typing import Any

import httpx

from amc.v1 import types_pb2
from cloud.store import decisions, flows
from cloud.store.paging import page_token
from export import dataset
from planner.decision import Decision, Usage
from planner.tools import Judgement
from tests.console.console_stack import Cloud, HostFactory, Operator
from tests.console.test_pages import csrf_of, log_in
from tests.support.flows import store_flow


def _flow(cloud: Cloud) -> str:
    goal = f"Turn on dark theme {uuid.uuid4().hex[:6]}"
    row = cloud.loop.run(store_flow(cloud.server.store, goal=goal, task_id="t-console"))
    return row.flow_id


def _log_tap(cloud: Cloud, host_id: str, task_id: str, attempt: int, **decision: Any) -> None:
    """Log a model's tap that opens Display on the attempt (`decision` overrides its fields)."""
    action = types_pb2.Action(purpose="open Display", expected_outcome="the 'Display' page is open")
    action.tap.element_id = "e2"
    fields: dict[str, Any] = {
        "tool_name": "tap",
        "arguments": {"element_id": "e2"},
        "action": action,
        "purpose": "open Display",
        "expected_outcome": "the 'Display' page is open",
        "rationale": "r",
        "thinking": [],
        "usage": Usage(),
        "provider": "offline",
        "model": "m",
        "latency_s": 0.0,
        "forced_retry": False,
        "system_prompt": "s",
        "user_prompt": "u",
    }
    fields.update(decision)
    cloud.loop.run(
        decisions.append(cloud.server.store, host_id, task_id, attempt, Decision(**fields))
    )


def test_the_flows_pages_list_show_and_disable_a_flow(anon: httpx.Client, cloud: Cloud) -> None:
    flow_id = _flow(cloud)
    log_in(anon)
    listing = anon.get("/flows")
    assert listing.status_code == 200
    assert f'href="/flows/{flow_id}"' in listing.text
    page = anon.get(f"/flows/{flow_id}")
    assert page.status_code == 200
    text = unescape(page.text)
    assert "the 'Dark theme' switch is on" in text and "turn 'Dark theme' on" in text
    assert re.search(r'data-field="status">active<', page.text)
    # without the CSRF token the form is refused; with it the flow is disabled
    assert anon.post(f"/flows/{flow_id}/status", data={"active": "0"}).status_code == 403
    done = anon.post(
        f"/flows/{flow_id}/status", data={"active": "0", "csrf_token": csrf_of(page.text)}
    )
    assert done.status_code == 303
    again = anon.get(f"/flows/{flow_id}")
    assert re.search(r'data-field="status">disabled<', again.text)
    assert "disabled by operator console: from the console" in unescape(again.text)
    assert anon.get("/flows/no-such-flow").status_code == 404


def test_the_api_reads_flows_and_sets_their_status(api: httpx.Client, cloud: Cloud) -> None:
    flow_id = _flow(cloud)
    got = api.get(f"/api/flows/{flow_id}").json()
    assert [s["tool_name"] for s in got["steps"]] == ["tap", "tap", "tap"]
    assert got["steps"][2]["target"] == "'Dark theme' LinearLayout"
    listed = api.get("/api/flows", params={"status": "active"}).json()
    assert flow_id in {f["flow_id"] for f in listed["flows"]}
    off = api.post(f"/api/flows/{flow_id}/status", json={"active": False, "reason": "x"})
    assert off.status_code == 200 and off.json()["status"] == "disabled"
    assert api.get("/api/flows", params={"status": "nonsense"}).status_code == 422
    assert api.get("/api/flows/nope").status_code == 404


def test_submit_with_no_replay_and_verdicts_on_the_task_page(
    anon: httpx.Client, cloud: Cloud, operator: Operator, make_host: HostFactory
) -> None:
    host = make_host()
    log_in(anon)
    form = anon.get("/tasks/new")
    assert 'name="no_replay"' in form.text
    posted = anon.post(
        "/tasks/new",
        data={
            "goal": "Open Display",
            "host_id": host.host_id,
            "no_replay": "1",
            "csrf_token": csrf_of(form.text),
        },
    )
    assert posted.status_code == 303
    task_id = posted.headers["location"].rsplit("/", 1)[-1]
    assert operator.get(task_id).no_replay
    a = host.assignment()
    assert a.task_id == task_id and not a.HasField("flow")
    host.renew(a, 1, types_pb2.STEP_STATUS_PLANNING, "step 1")
    store = cloud.server.store
    for index, (verdict, judged) in enumerate(
        [
            (types_pb2.VERDICT_MET, None),
            (types_pb2.VERDICT_NOT_MET, Judgement("met", "looks open")),
        ],
        start=1,
    ):
        _log_tap(cloud, host.host_id, task_id, a.attempt, previous_step=judged)
        cloud.loop.run(
            decisions.record_outcome(
                store,
                task_id,
                a.attempt,
                types_pb2.ActionOutcome(
                    step_index=index, executed=True, verdict=verdict, evidence=f"evidence {index}"
                ),
            )
        )
    cloud.loop.run(
        decisions.record_judgement(store, task_id, a.attempt, 2, Judgement("met", "looks open"))
    )
    page = unescape(anon.get(f"/tasks/{task_id}").text)
    assert "1 met" in page and "1 not met" in page and "0 unknown" in page
    assert "not met — evidence 2" in page
    assert "The model (next step) says met: looks open" in page
    assert "The checker and the model disagree." in page
    assert "not allowed (submitted with no replay)" in page
    assert "the task asked for no replay" in page
    host.finish(a, types_pb2.TASK_STATUS_SUCCEEDED, "done")


def test_the_flows_list_pages_back_to_newer_flows_and_the_first_page(
    anon: httpx.Client, cloud: Cloud
) -> None:
    """The flows list had only "Older flows →": from its second page nothing led back but the
    browser's own Back. It now pages as the tasks list does (First page, Newer, Older)."""
    for _ in range(3):
        _flow(cloud)
    log_in(anon)

    def links(page: httpx.Response) -> dict[str, str]:
        assert page.status_code == 200, page.text
        found = re.findall(r'<a href="([^"]+)"(?: rel="(prev|next)")?>([^<]+)</a>', page.text)
        return {label.strip(): unescape(url) for url, _rel, label in found if "page" in url}

    def shown(page: httpx.Response) -> list[str]:
        return re.findall(r'<tr data-flow-id="([^"]+)"', page.text)

    first = anon.get("/flows", params={"page_size": 1})
    assert len(shown(first)) == 1 and set(links(first)) == {"Older »"}
    second = anon.get(links(first)["Older »"])
    assert set(links(second)) == {"‹ Newer", "Older »"}
    assert links(second)["‹ Newer"] == "/flows?page_size=1"
    third = anon.get(links(second)["Older »"])
    assert {"« First page", "‹ Newer"} <= set(links(third))
    assert shown(anon.get(links(third)["‹ Newer"])) == shown(second)
    assert shown(anon.get(links(third)["« First page"])) == shown(first)
    assert len({*shown(first), *shown(second), *shown(third)}) == 3


def test_an_empty_page_past_the_last_flow_says_there_are_no_more(
    anon: httpx.Client, cloud: Cloud
) -> None:
    """A page past the end (the flows it would have shown deleted since its link was made)
    said "No flow learned yet", as if the cloud had learned nothing. The token here is one
    the cloud makes for a position older than any flow."""
    _flow(cloud)
    log_in(anon)
    assert "No flow learned yet" not in anon.get("/flows").text
    past_every_flow = page_token(flows.listing(()), "1970-01-01T00:00:00+00:00", "0")
    past = anon.get("/flows", params={"page_token": past_every_flow})
    assert past.status_code == 200, past.text
    assert not re.findall(r'<tr data-flow-id="([^"]+)"', past.text)
    assert "No more flows." in past.text and "No flow learned yet" not in past.text


def test_a_replayed_step_says_no_model_was_called_and_shows_no_thinking(
    anon: httpx.Client, cloud: Cloud, make_host: HostFactory
) -> None:
    """A replayed step on the task page had a "no thinking" pill, a Thinking section saying
    "The model wrote no thinking for this step" and a Prompts section: all of it said a model
    was called and thought nothing. It says it was replayed, with no model call."""
    host = make_host()
    log_in(anon)
    form = anon.get("/tasks/new")
    posted = anon.post(
        "/tasks/new",
        data={
            "goal": f"Open Display {uuid.uuid4().hex[:6]}",
            "host_id": host.host_id,
            "csrf_token": csrf_of(form.text),
        },
    )
    task_id = posted.headers["location"].rsplit("/", 1)[-1]
    a = host.assignment()
    assert a.task_id == task_id
    _log_tap(
        cloud,
        host.host_id,
        task_id,
        a.attempt,
        provider="replay",
        model="flow f-shown",
        system_prompt="",
        user_prompt="",
        extra={"mode": "replay"},
        flow_id="f-shown",
        flow_step=1,
    )
    _log_tap(cloud, host.host_id, task_id, a.attempt, extra={"mode": "compact"})
    page = unescape(anon.get(f"/tasks/{task_id}").text)
    replayed, modelled = page.split('<details class="step"')[1:3]
    assert "replayed · flow f-shown step 1 · no model call" in replayed
    assert "no model was called, so this step has no thinking" in replayed
    assert "The model wrote no thinking" not in replayed and "Prompts" not in replayed
    assert 'data-field="thinking-kind"' not in replayed
    assert "The model wrote no thinking" in modelled and "Prompts" in modelled
    host.finish(a, types_pb2.TASK_STATUS_SUCCEEDED, "done")


def test_a_step_where_a_replay_set_its_flow_aside_says_so(
    anon: httpx.Client, cloud: Cloud, make_host: HostFactory
) -> None:
    """The operator console's "flow F set aside at step N: why" line (a replay stopped at a
    switch already on: no divergence, nothing counted) had no test of its own; the host
    console's had. The step says the flow was set aside, why, that nothing was counted, and
    that the model decided it (not "took over", not "no model call")."""
    host = make_host()
    log_in(anon)
    form = anon.get("/tasks/new")
    posted = anon.post(
        "/tasks/new",
        data={
            "goal": f"Turn on dark theme {uuid.uuid4().hex[:6]}",
            "host_id": host.host_id,
            "csrf_token": csrf_of(form.text),
        },
    )
    task_id = posted.headers["location"].rsplit("/", 1)[-1]
    a = host.assignment()
    assert a.task_id == task_id
    why = "'Dark theme' LinearLayout is already on, so tapping it would undo what the flow does"
    replayed = {"provider": "replay", "model": "flow f-aside", "extra": {"mode": "replay"}}
    _log_tap(cloud, host.host_id, task_id, a.attempt, **replayed, flow_id="f-aside", flow_step=1)
    _log_tap(
        cloud,
        host.host_id,
        task_id,
        a.attempt,
        extra={"mode": "compact"},
        flow_id="f-aside",
        flow_step=2,
        flow_set_aside=why,
    )
    page = unescape(anon.get(f"/tasks/{task_id}").text)
    _, aside = page.split('<details class="step"')[1:3]
    assert "flow f-aside set aside at step 2" in aside
    said = re.sub(r"<[^>]+>", "", aside)
    assert f"flow f-aside set aside at step 2: {why} (no divergence: nothing counted" in said
    assert 'href="/flows/f-aside"' in aside
    assert "took over" not in aside and "no model call" not in aside
    assert "Prompts" in aside  # the model decided it
    host.finish(a, types_pb2.TASK_STATUS_SUCCEEDED, "done")
    # and the cloud's export says it too (before amc.export.step/4 it dropped the flow)
    exported = anon.get(f"/tasks/{task_id}/export")
    assert exported.status_code == 200
    with zipfile.ZipFile(io.BytesIO(exported.content)) as z:
        lines = [dataset.parse_line(x) for x in z.read("steps.jsonl").decode().splitlines()]
    current = [x for x in lines if isinstance(x, dataset.StepRecord)]
    assert len(current) == len(lines)  # written as the current schema
    assert [x.flow for x in current] == [
        dataset.FlowUseRecord(flow_id="f-aside", flow_step=1, divergence=None, set_aside=None),
        dataset.FlowUseRecord(flow_id="f-aside", flow_step=2, divergence=None, set_aside=why),
    ]
