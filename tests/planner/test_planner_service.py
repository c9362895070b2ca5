"""`PlannerService.Decide` over a real grpc.aio server on 127.0.0.1 port 0.

The lease gate and the decision sink are in-test implementations of the service's ports; the
cloud owner wires the real ones (the store's lease check and the decision log with its atomic
step index) in `cloud/`. Most tests run plaintext and say who the caller is in metadata; one test
runs the same servicer with mTLS, certificates from `cloud.pki` and the caller taken from the
client certificate with `cloud.identity.peer_caller`, the way the cloud deployment serves it.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc, types_pb2
from cloud import supervised
from planner.decide_limits import MAX_MESSAGE_BYTES
from planner.decision import Decision
from planner.errors import (
    PlannerAuthError,
    PlannerError,
    PlannerRateLimited,
    PlannerUnavailable,
)
from planner.model_profiles import RetryForm
from planner.observation import observation_from_scene
from planner.planner import Planner
from planner.prompts import SYSTEM_PROMPT, build_user_prompt
from planner.providers.offline import OfflineProvider
from planner.service import PlannerServicer
from planner.settings import PlannerSettings
from planner.vendors import Turn, TurnRequest, make_adapter
from planner.vendors.observed import ObservedProbeableAdapter
from telemetry import logs
from tests.planner import scenes
from tests.support.fakes import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    FakeModelServer,
    ScriptedTurn,
    anthropic_error,
    chat_completion,
    openai_tool_call,
    rate_limited_anthropic,
    text,
    tool_use,
)
from tests.support.memory_log import MemoryDecisionLog
from tests.support.screenshots import phone_png
from tests.support.tracing import memory_exporter
from tests.support.waiting import until

HOST = "host-a"
LEASE = ("task-1", 1, "lease-1")
OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


class Gate:
    """LeaseGate: a fixed set of live (host, task, attempt, lease) tuples; counts its calls."""

    def __init__(self, *live: tuple[str, str, int, str]) -> None:
        self.live = set(live)
        self.calls = 0

    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
        self.calls += 1
        return (host_id, task_id, attempt, lease_id) in self.live


class MemorySink(MemoryDecisionLog):
    """The servicer's sink and attempt log, knowing the goal of the test lease's task."""

    def __init__(self) -> None:
        super().__init__({LEASE[0]: "Turn on dark theme"})


@dataclass
class Recording:
    """A provider that delegates to another and records every request it got."""

    inner: Any
    requests: list[TurnRequest] = field(default_factory=list)
    fail_with: Exception | None = None

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def model(self) -> str:
        return str(self.inner.model)

    @property
    def retry_form(self) -> RetryForm:
        form: RetryForm = self.inner.retry_form
        return form

    async def complete(self, request: TurnRequest) -> Turn:
        self.requests.append(request)
        if self.fail_with is not None:
            raise self.fail_with
        response: Turn = await self.inner.complete(request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def metadata_host(context: Any) -> str:
    """Test stand-in for the certificate identity on a plaintext server."""
    host: str = dict(context.invocation_metadata()).get("x-test-host", "")
    return host


@dataclass
class Running:
    stub: Any
    gate: Gate
    sink: MemorySink
    provider: Recording


@pytest.fixture
async def make_server() -> AsyncIterator[Callable[..., Any]]:
    servers: list[Any] = []
    channels: list[Any] = []

    async def start(
        provider: Any = None, gate: Gate | None = None, settings: PlannerSettings | None = None
    ) -> Running:
        gate = gate or Gate((HOST, *LEASE))
        sink = MemorySink()
        recording = Recording(provider or OfflineProvider())
        server = grpc.aio.server(options=OPTIONS)
        planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(
            PlannerServicer(
                caller_host_id=metadata_host,
                lease_gate=gate,
                sink=sink,
                planner=Planner(recording, settings),
                attempts=sink,
            ),
            server,
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
        channels.append(channel)
        return Running(planner_service_pb2_grpc.PlannerServiceStub(channel), gate, sink, recording)

    yield start
    for channel in channels:
        await channel.close()
    for server in servers:
        await server.stop(grace=None)


def request(
    goal: str = "Turn on dark theme", scene: Any = None, **overrides: Any
) -> planner_service_pb2.DecideRequest:
    scene = scene or scenes.launcher()
    values: dict[str, Any] = {
        "task_id": LEASE[0],
        "attempt": LEASE[1],
        "lease_id": LEASE[2],
        "system_prompt": SYSTEM_PROMPT,
        "user_prompt": build_user_prompt(goal, scene, []),
        "element_ids": [e.element_id for e in scene.elements],
        "screen_width": scene.screen_width,
        "screen_height": scene.screen_height,
        **overrides,
    }
    return planner_service_pb2.DecideRequest(**values)


MD = (("x-test-host", HOST),)


async def test_decide_logs_one_row_and_returns_every_field(make_server: Callable[..., Any]) -> None:
    srv: Running = await make_server()
    response = await srv.stub.Decide(request(), metadata=MD)
    d = response.decision

    assert d.step_index == 1
    assert d.decision_id == "dec-1"
    assert (d.host_id, d.task_id, d.attempt) == (HOST, "task-1", 1)
    assert d.provider == "offline"
    assert d.model
    assert d.tool_name == "tap"
    assert json.loads(d.arguments_json) == {"element_id": "e4"}
    assert d.action.tap.element_id == "e4"
    assert d.purpose
    assert d.expected_outcome
    assert d.rationale
    assert d.action.purpose == d.purpose
    assert d.system_prompt == SYSTEM_PROMPT
    assert d.usage.input_tokens > 0
    assert d.created_at.seconds > 0
    assert d.forced_retry is False
    assert d.corrective_retries == 0
    (row,) = srv.sink.rows
    assert row[:4] == (HOST, "task-1", 1, 1)


async def test_a_lease_that_is_not_live_is_refused_before_any_tokens(
    make_server: Callable[..., Any],
) -> None:
    srv: Running = await make_server()
    for bad in (
        request(lease_id="lease-old"),
        request(attempt=2),
        request(task_id="task-other"),
        request(lease_id="lease-old", user_prompt="x" * (600 * 1024)),  # lease before size
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await srv.stub.Decide(bad, metadata=MD)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as other_host:
        await srv.stub.Decide(request(), metadata=(("x-test-host", "host-b"),))
    assert other_host.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not a live lease of host 'host-b'" in (other_host.value.details() or "")
    assert srv.provider.requests == []
    assert srv.sink.rows == []


@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"user_prompt": "x" * (512 * 1024 + 1)}, "user_prompt"),
        ({"system_prompt": "s" * (64 * 1024 + 1)}, "system_prompt"),
        ({"screenshot": b"\x89PNG" + b"\0" * (8 * 1024 * 1024)}, "screenshot"),
        ({"user_prompt": "  "}, "user_prompt"),
    ],
)
async def test_oversize_input_is_invalid_argument_naming_the_field(
    make_server: Callable[..., Any], overrides: dict[str, Any], field_name: str
) -> None:
    srv: Running = await make_server()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await srv.stub.Decide(request(**overrides), metadata=MD)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(field_name)
    assert srv.provider.requests == []
    assert srv.sink.rows == []


async def test_twenty_concurrent_calls_get_distinct_step_indexes(
    make_server: Callable[..., Any],
) -> None:
    srv: Running = await make_server()
    responses = await asyncio.gather(*(srv.stub.Decide(request(), metadata=MD) for _ in range(20)))
    indexes = sorted(r.decision.step_index for r in responses)
    assert indexes == list(range(1, 21))
    assert len({r.decision.decision_id for r in responses}) == 20
    assert len(srv.sink.rows) == 20


async def test_screenshot_is_used_for_the_call_and_never_stored(
    make_server: Callable[..., Any],
) -> None:
    srv: Running = await make_server(settings=PlannerSettings(send_screenshot=True))
    shot = b"\x89PNG\r\n\x1a\n" + b"SCREENSHOT-MARKER" * 64
    response = await srv.stub.Decide(request(screenshot=shot), metadata=MD)
    assert response.decision.step_index == 1
    (sent,) = srv.provider.requests
    assert sent.images == {0: shot}
    (row,) = srv.sink.rows
    stored = row[4]
    assert b"SCREENSHOT-MARKER" not in repr(stored).encode()
    assert "SCREENSHOT-MARKER" not in json.dumps(stored.extra)
    assert b"SCREENSHOT-MARKER" not in response.SerializeToString()


async def test_a_model_without_image_input_gets_no_screenshot_on_the_prompt_path(
    make_server: Callable[..., Any], fake_server: FakeModelServer
) -> None:
    """The deprecated prompt path sent a host's screenshot whatever the cloud's settings, so a
    model without image input (o3-mini: `send_screenshot` is refused it at start) got one and
    answered 400, a failed step. It follows the typed path's rule now: the screenshot goes only
    when the cloud sends screenshots. The real OpenAI SDK against the fake API."""
    settings = PlannerSettings(
        provider="openai",
        model="o3-mini",
        openai_api_key=OPENAI_KEY,
        openai_base_url=fake_server.openai_base_url,
        max_retries=0,
    )
    adapter = make_adapter(settings)
    tap = {"element_id": "e4", "purpose": "open settings", "expected_outcome": "settings open"}
    fake_server.script_openai(chat_completion(None, openai_tool_call("tap", tap)))
    shot = phone_png(108, 240, noisy_rows=0)
    try:
        srv: Running = await make_server(adapter, settings=settings)
        response = await srv.stub.Decide(request(screenshot=shot), metadata=MD)
    finally:
        await adapter.aclose()
    assert response.decision.tool_name == "tap"
    (body,) = fake_server.bodies("/chat/completions")
    assert body["model"] == "o3-mini"
    assert "image_url" not in json.dumps(body)
    assert "No screenshot this step" not in json.dumps(body)
    (sent,) = srv.provider.requests
    assert sent.images == {}


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (
            PlannerRateLimited("planner: Anthropic rate limit still hit after 2 retries"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        (
            PlannerUnavailable("planner: Anthropic is unavailable (HTTP 529)"),
            grpc.StatusCode.UNAVAILABLE,
        ),
        # Refused credentials fail fast (the host does not wait for them); no usable decision
        # is UNKNOWN (before the error classes, both were UNAVAILABLE).
        (
            PlannerAuthError("planner: Anthropic rejected the API key"),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
        (
            PlannerError("planner: anthropic gave an unusable tool call twice: x"),
            grpc.StatusCode.UNKNOWN,
        ),
    ],
)
async def test_provider_failure_logs_nothing(
    make_server: Callable[..., Any], error: Exception, code: grpc.StatusCode
) -> None:
    srv: Running = await make_server()
    srv.provider.fail_with = error
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await srv.stub.Decide(request(), metadata=MD)
    assert info.value.code() == code
    assert info.value.details() == str(error)
    assert srv.sink.rows == []


async def _refused_through_decide(
    make_server: Callable[..., Any],
    fake_server: FakeModelServer,
    replies: list[Any],
    **settings: Any,
) -> tuple[grpc.aio.AioRpcError, Running]:
    """Decide on a real Anthropic SDK pointed at the fake API, which answers `replies`: the
    error the caller got, and the server (its decision log)."""
    adapter = make_adapter(
        PlannerSettings(
            provider="anthropic",
            anthropic_api_key=ANTHROPIC_KEY,
            anthropic_base_url=fake_server.anthropic_base_url,
            **{"model": "claude-test-model", **settings},
        )
    )
    srv: Running = await make_server(adapter)
    fake_server.script_anthropic(*replies)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await srv.stub.Decide(request(), metadata=MD)
    finally:
        await adapter.aclose()
    return info.value, srv


async def test_real_sdk_rate_limit_through_decide_is_resource_exhausted(
    make_server: Callable[..., Any], fake_server: FakeModelServer
) -> None:
    error, srv = await _refused_through_decide(
        make_server,
        fake_server,
        [rate_limited_anthropic(), rate_limited_anthropic()],
        max_retries=1,
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit" in (error.details() or "")
    assert len(fake_server.requests) == 2
    assert srv.sink.rows == []


async def test_a_long_provider_wait_is_passed_on_to_the_host(
    make_server: Callable[..., Any], fake_server: FakeModelServer
) -> None:
    """A retry-after longer than one call waits (the planner's own limit) ends the call at once,
    and the answer tells the host how long to wait (`amc-retry-after-s`), so it does not ask
    again into the same limit."""
    from host.planner_client import _retry_after
    from planner.errors import RETRY_AFTER_KEY

    error, _ = await _refused_through_decide(
        make_server,
        fake_server,
        [anthropic_error(429, "rate_limit_error", "Rate limited", retry_after="171")],
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (RETRY_AFTER_KEY, "171") in tuple(error.trailing_metadata() or ())
    assert _retry_after(error) == 171.0
    assert len(fake_server.requests) == 1


async def test_a_model_refusal_through_decide_is_unknown_and_asked_once(
    make_server: Callable[..., Any], fake_server: FakeModelServer
) -> None:
    """A refusal is a non-retryable planner failure: UNKNOWN naming the refusal's category,
    one provider call, nothing logged (the host fails the attempt and does not ask again)."""
    refusal = ScriptedTurn(
        [text("I can't help with that.")],
        stop_reason="refusal",
        stop_details={"type": "refusal", "category": "bio", "explanation": None},
    )
    error, srv = await _refused_through_decide(
        make_server, fake_server, [refusal], model="claude-sonnet-4-6", max_retries=1
    )
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert "refused to answer (category bio)" in (error.details() or "")
    assert len(fake_server.requests) == 1
    assert srv.sink.rows == []


async def test_a_prompt_over_the_context_window_through_decide_is_unknown_and_asked_once(
    make_server: Callable[..., Any], fake_server: FakeModelServer
) -> None:
    """Claude stopped at its context window (`model_context_window_exceeded`) was taken for an
    answer cut off at max_tokens: asked again with a corrective turn on top (more context),
    which overflowed again. A compact prompt that does not fit fails the decision at once:
    UNKNOWN naming the context window, one provider call, nothing logged."""
    overflowed = ScriptedTurn(
        [text("Opening"), tool_use("tap", {"element_id": "e1", "purpose": "p"})],
        stop_reason="model_context_window_exceeded",
    )
    error, srv = await _refused_through_decide(
        make_server, fake_server, [overflowed, overflowed], model="claude-sonnet-4-6"
    )
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert "context window" in (error.details() or "")
    assert len(fake_server.requests) == 1
    assert srv.sink.rows == []


async def test_sensitive_text_reaches_the_host_but_is_masked_everywhere_else(
    make_server: Callable[..., Any],
) -> None:
    scene = scenes.contact_editor()
    scene.elements[3] = scenes.el(
        4,
        "Password",
        (48, 336, 1032, 496),
        clickable=True,
        class_name="android.widget.EditText",
        password=True,
    )
    srv: Running = await make_server()
    response = await srv.stub.Decide(request("Sign in with password hunter2", scene), metadata=MD)
    d = response.decision
    assert d.tool_name == "input_text"
    assert d.action.input_text.sensitive is True
    assert d.action.input_text.text == "hunter2"  # the host must type it
    assert json.loads(d.arguments_json)["text"] == "•••"
    stored = srv.sink.rows[0][4]
    assert stored.masked_arguments()["text"] == "•••"


async def test_decide_over_mtls_takes_the_host_from_the_client_certificate(tmp_path: Any) -> None:
    pki = pytest.importorskip("cloud.pki")
    identity = pytest.importorskip("cloud.identity")
    ca = pki.create_ca()
    server_pair = pki.create_server_cert(ca)
    host_pair = pki.create_host_cert(ca, HOST)
    other_pair = pki.create_host_cert(ca, "host-b")

    def host_from_cert(context: Any) -> str:
        caller = identity.peer_caller(context)
        return caller.name if caller is not None and caller.kind == "host" else ""

    gate, sink = Gate((HOST, *LEASE)), MemorySink()
    server = grpc.aio.server(options=OPTIONS)
    planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(
        PlannerServicer(
            caller_host_id=host_from_cert,
            lease_gate=gate,
            sink=sink,
            planner=Planner(OfflineProvider()),
            attempts=sink,
        ),
        server,
    )
    credentials = grpc.ssl_server_credentials(
        [(server_pair.key_pem, server_pair.cert_pem)],
        root_certificates=ca.cert_pem,
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        for pair, expected in (
            (host_pair, grpc.StatusCode.OK),
            (other_pair, grpc.StatusCode.FAILED_PRECONDITION),
        ):
            creds = grpc.ssl_channel_credentials(ca.cert_pem, pair.key_pem, pair.cert_pem)
            async with grpc.aio.secure_channel(
                f"localhost:{port}", creds, options=OPTIONS
            ) as channel:
                stub = planner_service_pb2_grpc.PlannerServiceStub(channel)
                try:
                    response = await stub.Decide(request())
                    code = grpc.StatusCode.OK
                    assert response.decision.host_id == HOST
                except grpc.aio.AioRpcError as err:
                    code = err.code()
                assert code == expected
    finally:
        await server.stop(grace=None)
    assert [row[0] for row in sink.rows] == [HOST]


def test_decision_proto_round_trip() -> None:
    from planner.convert import decision_from_proto, decision_to_proto

    action = types_pb2.Action(purpose="p", expected_outcome="o")
    action.swipe.start.x, action.swipe.start.y, action.swipe.end.x, action.swipe.end.y = (
        1,
        900,
        1,
        100,
    )
    decision = Decision(
        tool_name="swipe",
        arguments={"start_x": 1, "start_y": 900, "end_x": 1, "end_y": 100},
        action=action,
        purpose="p",
        expected_outcome="o",
        rationale="r",
        thinking=[],
        usage=__import__("planner.decision", fromlist=["Usage"]).Usage(input_tokens=3),
        provider="offline",
        model="m",
        latency_s=0.25,
        forced_retry=True,
        system_prompt="s",
        user_prompt="u",
        step_index=4,
    )
    back = decision_from_proto(decision_to_proto(decision, decision_id="d1"))
    assert back.arguments == decision.arguments
    assert (back.step_index, back.forced_retry, back.latency_s, back.usage.input_tokens) == (
        4,
        True,
        0.25,
        3,
    )
    assert back.extra == {"decision_id": "d1"}


async def test_a_call_without_host_identity_is_unauthenticated(
    make_server: Callable[..., Any],
) -> None:
    srv: Running = await make_server()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await srv.stub.Decide(request())
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert srv.gate.calls == 0
    assert srv.sink.rows == []


# --- the typed contract: the host sends what it sees, the cloud builds the prompts ----------


def typed(scene: Any = None, **overrides: Any) -> planner_service_pb2.DecideRequest:
    """A Decide request as hosts send it: lease, observation and (optionally) the outcome."""
    values: dict[str, Any] = {
        "task_id": LEASE[0],
        "attempt": LEASE[1],
        "lease_id": LEASE[2],
        "observation": observation_from_scene(scene or scenes.launcher()),
        **overrides,
    }
    return planner_service_pb2.DecideRequest(**values)


async def test_typed_request_gets_goal_and_history_from_the_cloud(
    make_server: Callable[..., Any],
) -> None:
    """No prompt text on the wire: the goal comes from the task, the history from the logged
    decisions with the outcome the next call reported (error text included)."""
    srv: Running = await make_server()
    first = (await srv.stub.Decide(typed(scenes.launcher()), metadata=MD)).decision
    assert first.step_index == 1
    assert first.tool_name == "tap"
    assert first.system_prompt == SYSTEM_PROMPT
    assert first.mode == types_pb2.PLANNER_MODE_COMPACT
    assert first.model_provider == types_pb2.MODEL_PROVIDER_OFFLINE
    assert json.dumps("Turn on dark theme") in first.user_prompt
    assert first.user_prompt == build_user_prompt("Turn on dark theme", scenes.launcher(), [])

    outcome = types_pb2.ActionOutcome(
        step_index=1, executed=False, error="no element e4 on this screen", driver_output=""
    )
    second = (
        await srv.stub.Decide(typed(scenes.launcher(), previous_outcome=outcome), metadata=MD)
    ).decision
    assert second.step_index == 2
    history = second.user_prompt.split("```json history\n", 1)[1].split("\n```", 1)[0]
    (record,) = json.loads(history)
    assert record["success"] is False
    assert record["error"] == "no element e4 on this screen"
    assert record["page"] == "com.android.launcher3: Home"
    assert record["action"]["target"] == "Settings"  # the tapped element's label
    assert srv.sink.outcomes[("task-1", 1, 1)] == outcome
    # A retried report of the same step changes nothing (the first report wins).
    retry = types_pb2.ActionOutcome(step_index=1, executed=True)
    await srv.stub.Decide(typed(scenes.launcher(), previous_outcome=retry), metadata=MD)
    assert srv.sink.outcomes[("task-1", 1, 1)] == outcome


def _with_element(**fields: Any) -> types_pb2.ScreenObservation:
    observation = observation_from_scene(scenes.launcher())
    element = observation.elements[0]
    for name, value in fields.items():
        if name == "bounds":
            element.ClearField("bounds")
            if value is not None:
                element.bounds.CopyFrom(value)
        else:
            setattr(element, name, value)
    return observation


def _observation(**fields: Any) -> types_pb2.ScreenObservation:
    observation = observation_from_scene(scenes.launcher())
    for name, value in fields.items():
        if name == "elements":
            del observation.elements[:]
            observation.elements.extend(value)
        elif name == "ocr_blocks":
            observation.ocr_blocks.extend(value)
        else:
            setattr(observation, name, value)
    return observation


def _many(n: int) -> list[types_pb2.UiElement]:
    rect = types_pb2.Rect(left=0, top=0, right=1, bottom=1)
    return [types_pb2.UiElement(element_id=f"e{i}", bounds=rect) for i in range(n)]


@pytest.mark.parametrize(
    ("request_", "field_name"),
    [
        (typed(observation=_with_element(text="x" * 4097)), "observation.elements[0].text"),
        (
            typed(observation=_with_element(content_description="é" * 2049)),
            "observation.elements[0].content_description",
        ),
        (typed(observation=_with_element(element_id="")), "observation.elements[0].element_id"),
        (
            typed(observation=_with_element(element_id="e2")),
            "observation.elements[1].element_id: 'e2' is used twice",
        ),
        (
            typed(observation=_with_element(resource_id="r" * 257)),
            "observation.elements[0].resource_id",
        ),
        (typed(observation=_with_element(bounds=None)), "observation.elements[0].bounds"),
        (
            typed(
                observation=_with_element(bounds=types_pb2.Rect(left=10, top=0, right=5, bottom=5))
            ),
            "observation.elements[0].bounds",
        ),
        (typed(observation=_observation(screen_width=0)), "observation.screen_width"),
        (typed(observation=_observation(screen_height=20000)), "observation.screen_height"),
        (typed(observation=_observation(elements=_many(1001))), "observation.elements"),
        (
            typed(
                observation=_observation(
                    ocr_blocks=[
                        types_pb2.OcrBlock(
                            text="x",
                            bounds=types_pb2.Rect(left=0, top=0, right=1, bottom=1),
                            confidence=150,
                        )
                    ]
                )
            ),
            "observation.ocr_blocks[0].confidence",
        ),
        (typed(observation=_observation(title="t" * 1025)), "observation.title"),
        (
            typed(observation=_observation(foreground_activity="a" * 513)),
            "observation.foreground_activity",
        ),
        (
            typed(previous_outcome=types_pb2.ActionOutcome(step_index=7, executed=True)),
            "previous_outcome.step_index",
        ),
        (
            typed(previous_outcome=types_pb2.ActionOutcome(step_index=0)),
            "previous_outcome.step_index",
        ),
        (
            typed(previous_outcome=types_pb2.ActionOutcome(step_index=7, evidence="e" * 513)),
            "previous_outcome.evidence is 513 bytes; at most 512",
        ),
        (
            typed(screenshot=b"\x89PNG" + b"\0" * (8 * 1024 * 1024)),
            "screenshot",
        ),
        (
            planner_service_pb2.DecideRequest(task_id="task-1", attempt=1, lease_id="lease-1"),
            "observation",
        ),
        (typed(user_prompt="also prompts"), "set observation"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_bad_observation_is_invalid_argument_naming_the_field(
    make_server: Callable[..., Any], request_: planner_service_pb2.DecideRequest, field_name: str
) -> None:
    srv: Running = await make_server()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await srv.stub.Decide(request_, metadata=MD)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(field_name), info.value.details()
    assert srv.provider.requests == []
    assert srv.sink.rows == []


async def test_unknown_element_sources_and_overlays_read_as_unspecified(
    make_server: Callable[..., Any],
) -> None:
    """proto3 enums are open: a newer host may send an element source or overlay kind this
    cloud does not know. Both only inform the model, so the step is planned as if the host had
    not said (a hierarchy node, no overlay), not refused: the model sees the same screen."""
    srv: Running = await make_server()
    observation = observation_from_scene(scenes.launcher())
    observation.elements[0].source = 99  # type: ignore[assignment]  # a newer host's value
    observation.overlays.append(99)  # type: ignore[arg-type]  # a newer host's value
    response = await srv.stub.Decide(typed(observation=observation), metadata=MD)
    assert response.decision.user_prompt == build_user_prompt(
        "Turn on dark theme", scenes.launcher(), []
    )


async def test_an_unknown_rotation_is_still_refused(make_server: Callable[..., Any]) -> None:
    """A rotation changes what the coordinates mean: one this cloud does not know is refused
    rather than guessed."""
    srv: Running = await make_server()
    bad = typed(observation=_observation(rotation=99))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await srv.stub.Decide(bad, metadata=MD)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "observation.rotation: unknown value 99"
    assert srv.provider.requests == []


async def test_a_stale_lease_is_refused_before_the_observation_is_even_read(
    make_server: Callable[..., Any],
) -> None:
    srv: Running = await make_server()
    bad = typed(lease_id="lease-old", observation=_observation(screen_width=0))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await srv.stub.Decide(bad, metadata=MD)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_session_mode_without_a_conversation_provider_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="AMC_PLANNER_MODE=session needs"):
        PlannerServicer(
            caller_host_id=metadata_host,
            lease_gate=Gate(),
            sink=MemorySink(),
            planner=Planner(OfflineProvider()),
            attempts=MemorySink(),
            mode="session",
        )


async def test_a_provider_error_page_reaches_the_host_cut_short_with_its_status(
    make_server: Callable[..., Any], fake_server: FakeModelServer
) -> None:
    """A load balancer in front of the API answers 502 with a whole HTML page, which the SDK
    puts in its error's message. Passed on whole, 40 KB of page overflowed the status's
    trailers: the host saw RESOURCE_EXHAUSTED ("received trailing metadata size exceeds
    limit") instead of UNAVAILABLE, and waited on the wrong rule. The reason is cut short."""
    page = "<!DOCTYPE html><html><body>" + "<p>502 Bad Gateway</p>\n" * 2_000 + "</body></html>"
    fake_server.answer_with_page(page, status=502)
    error, srv = await _refused_through_decide(make_server, fake_server, [], max_retries=0)
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    details = error.details() or ""
    assert "502" in details
    assert len(details) < 1_000
    assert srv.sink.rows == []


#: An API key of no known shape (a proxy's or a gateway's own), as the cloud may be configured.
SHAPELESS_KEY = "gw7f3a9c2e11d04b6a8e5fq"


@pytest.mark.parametrize(
    ("vendor", "model"), [("anthropic", "claude-test-model"), ("openai", "gpt-4o")]
)
async def test_a_provider_error_that_echoes_the_key_writes_it_nowhere(
    make_server: Callable[..., Any], fake_server: FakeModelServer, vendor: str, model: str
) -> None:
    """A proxy in front of the API that echoes the request's headers in its error body
    (`Authorization: Bearer …`, `x-api-key: …`) put the configured key in the status details a
    host got (OpenAI's bearer header, whatever the key's shape: only `sk-…` and `key-…` were
    scrubbed) and, through the SDK error each planner error was raised from, in every logged
    traceback (the provider-probe loop's, the RPC boundary's) and the model call's span event.
    The real SDKs against the fake API made to echo; the log is the handler every process
    writes through."""
    exporter = memory_exporter()
    buffer = io.StringIO()
    root = logging.getLogger()
    handler = logs.handler("text", buffer)
    root.addHandler(handler)
    base_url = (
        fake_server.anthropic_base_url if vendor == "anthropic" else fake_server.openai_base_url
    )
    configured: dict[str, Any] = {
        f"{vendor}_api_key": SHAPELESS_KEY,
        f"{vendor}_base_url": base_url,
    }
    adapter = make_adapter(
        PlannerSettings(provider=vendor, model=model, max_retries=0, **configured)
    )
    assert isinstance(adapter, ObservedProbeableAdapter)
    fake_server.echo_headers(502)
    probing = supervised.start("provider-probe", adapter.probe, interval=60.0)
    try:
        srv: Running = await make_server(adapter)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await srv.stub.Decide(request(), metadata=MD)
        await until(lambda: "provider-probe failed" in buffer.getvalue(), what="the probe's log")
    finally:
        await supervised.stop([probing])
        root.removeHandler(handler)
        await adapter.aclose()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "HTTP 502" in (info.value.details() or "")
    assert all(SHAPELESS_KEY in r.headers.get("authorization", r.headers.get("x-api-key", ""))
               for r in fake_server.requests)  # fmt: skip
    events = [str(e.attributes) for s in exporter.get_finished_spans() for e in s.events]
    assert events, "the model call's span records its exception"
    written = {
        "status details": info.value.details() or "",
        "log": buffer.getvalue(),
        "span events": "\n".join(events),
    }
    for where, what in written.items():
        assert SHAPELESS_KEY not in what, where


class _CancelledMeanwhile(Recording):
    """A provider during whose answer the lease ends (the operator cancels the task)."""

    def __init__(self, gate: Gate) -> None:
        super().__init__(OfflineProvider())
        self.gate = gate

    async def complete(self, request: TurnRequest) -> Turn:
        self.gate.live.clear()
        return await super().complete(request)


async def test_a_lease_that_ends_during_the_model_call_gets_no_action_but_keeps_the_record(
    make_server: Callable[..., Any],
) -> None:
    """The lease was live when the Decide arrived and gone when the model answered (a cancel
    in those seconds). The host is refused (FAILED_PRECONDITION) rather than handed an action
    for a cancelled task, which only its own revoke handling stood between and the phone; the
    decision, paid for, is logged. Before, the action came back as if nothing had happened."""
    gate = Gate((HOST, *LEASE))
    srv: Running = await make_server(provider=_CancelledMeanwhile(gate), gate=gate)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await srv.stub.Decide(request(), metadata=MD)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ended while the model was deciding" in (info.value.details() or "")
    assert "logged as step 1" in (info.value.details() or "")
    (row,) = srv.sink.rows
    assert row[:4] == (HOST, "task-1", 1, 1)
