"""One local HTTP server hosting a fake of each provider wire format the planner speaks.

Tests point the real `anthropic` and `openai` SDKs at it (`base_url`), script the model's
answers per wire format, and assert on the request bodies and headers the SDKs actually sent.
Each wire format lives in its own module (`anthropic.py`: Messages; `openai.py`: Chat
Completions and Responses) and enforces the documented rules with the real error messages, so a
client regression fails a test instead of passing against a lenient fake; what a model accepts
is looked up in one table (`rules.py`). A request it rejects consumes no scripted answer.

It is a `http.server.ThreadingHTTPServer` on 127.0.0.1 port 0 in a daemon thread: no framework,
nothing to mock.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

BAD_KEY = "bad-key"  # with no key configured, any request with this API key gets a 401


@dataclass(slots=True)
class Reply:
    """One scripted HTTP answer (an error, or a complete body given verbatim)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Recorded:
    """One request as the server received it; `error` is why it was rejected, if it was."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0
    error: str | None = None


@dataclass(slots=True)
class Answer:
    """What a wire format answers: a JSON reply, or (for `stream`) SSE events, optionally cut
    off before the end (`interrupted`)."""

    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] | None = None
    html: str | None = None
    """Served instead of the JSON body, as text/html."""
    cut: bool = False
    """The body stops short of its content-length and the connection closes."""
    hold: threading.Event | None = None
    """Nothing is sent until this is set (at most a minute): a provider still working on the
    answer, which a client's cancel or deadline cuts off."""
    hold_at: int | None = None
    """With `hold` and `events`: that many events are sent first, then the rest once `hold` is
    set (a stream the provider is still writing)."""


class Rejected(Exception):
    """A request the wire format refuses; carries the vendor-shaped error reply."""

    def __init__(self, reply: Reply, reason: str) -> None:
        super().__init__(reason)
        self.reply = reply
        self.reason = reason


class WireFormat(Protocol):
    """One provider endpoint: validates a request and answers it from its script."""

    paths: tuple[str, ...]

    @property
    def pending(self) -> int: ...

    def check_key(self, headers: dict[str, str]) -> None: ...

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer: ...

    def outage(self, status: int) -> Reply:
        """The vendor's reply while the provider is down (`FakeServer.go_down`)."""
        ...

    def model_info(self, model: str) -> dict[str, Any]:
        """`GET /v1/models/{model}` (what the planner's availability probe asks)."""
        ...


class FakeServer:
    """The HTTP listener; routes each POST to the wire format that owns its path."""

    def __init__(self, formats: Iterable[WireFormat]) -> None:
        self.formats = list(formats)
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.down_status: int | None = None
        self.outage_hits = 0
        #: While set, every request (and probe) is answered HTTP 200 with this page as text/html:
        #: a proxy or gateway answering in the API's place (`answer_with_page`).
        self.page: str | None = None
        self.page_status = 200
        self.page_cut = False
        #: The Content-Type of a streamed answer (None: the header is left out, as some proxies
        #: in front of the API do).
        self.stream_content_type: str | None = "text/event-stream"
        #: While set, every request (and probe) is answered with this HTTP status and an error
        #: body that quotes the request's headers, credentials included: a proxy in front of the
        #: API that echoes what it was sent when the upstream fails (`echo_headers`).
        self.echo_status: int | None = None
        #: While set, the connection of every answer is reset (SO_LINGER 0: an RST, no FIN)
        #: right after the answer's last byte: a proxy or load balancer that drops the
        #: connection as it closes. The answer itself arrives whole.
        self.reset_after_answer = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- lifecycle ---
    def start(self) -> FakeServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def anthropic_base_url(self) -> str:
        """For `AsyncAnthropic(base_url=...)` (the SDK appends /v1/messages)."""
        return self.base_url

    @property
    def openai_base_url(self) -> str:
        """For `AsyncOpenAI(base_url=...)` (includes /v1)."""
        return self.base_url + "/v1"

    # --- what tests read ---
    def bodies(self, path_suffix: str = "") -> list[dict[str, Any]]:
        """Bodies of the requests (to one endpoint, by path suffix) in arrival order."""
        return [r.body for r in self.requests if r.path.endswith(path_suffix)]

    @property
    def rejections(self) -> list[str]:
        """Why each rejected request was rejected, in order."""
        return [r.error for r in self.requests if r.error]

    @property
    def pending(self) -> int:
        """Scripted answers not used yet, over every wire format."""
        return sum(f.pending for f in self.formats)

    # --- the provider going down and coming back ---
    def go_down(self, status: int = 529) -> None:
        """From now on every call (and probe) gets the vendor's `status` error without using
        the script, as in a provider outage; `outage_hits` counts them."""
        with self.lock:
            self.down_status = status

    def come_back(self) -> None:
        with self.lock:
            self.down_status = None

    def answer_with_page(self, page: str | None, status: int = 200, *, cut: bool = False) -> None:
        """From now on (None: no longer) every request gets HTTP `status` with `page` as
        text/html, without using the script: a proxy or gateway in front of the API answering
        in its place (a login page, a load balancer's 502 page), or a base URL that names a web
        page. `cut`: the connection drops before the page's end."""
        with self.lock:
            self.page = page
            self.page_status = status
            self.page_cut = cut

    def echo_headers(self, status: int | None) -> None:
        """From now on (None: no longer) every request gets HTTP `status` with a JSON error
        body whose message, and a `headers` field beside it, quote the request's headers."""
        with self.lock:
            self.echo_status = status

    # --- handling ---
    def _echoed(self, record: Recorded) -> Answer | None:
        if self.echo_status is None:
            return None
        record.status = self.echo_status
        quoted = "; ".join(f"{k}: {v}" for k, v in record.headers.items())
        error = {"type": "api_error", "message": f"upstream failed for request ({quoted})"}
        return Answer(self.echo_status, {"error": error, "headers": record.headers})

    def handle(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        record = Recorded(path, headers, body)
        with self.lock:
            self.requests.append(record)
            echoed = self._echoed(record)
            if echoed is not None:
                return echoed
            if self.page is not None:
                record.status = self.page_status
                return Answer(self.page_status, html=self.page, cut=self.page_cut)
            fmt = next((f for f in self.formats if path.rstrip("/") in f.paths), None)
            try:
                if fmt is None:
                    raise Rejected(Reply(404, {"error": {"message": f"no route {path}"}}), "404")
                self._refuse_while_down(fmt)
                fmt.check_key(headers)
                answer = fmt.answer(path, headers, body)
            except Rejected as rejected:
                record.error = rejected.reason
                answer = Answer(rejected.reply.status, rejected.reply.body, rejected.reply.headers)
        record.status = answer.status
        return answer

    def handle_get(self, path: str, headers: dict[str, str]) -> Answer:
        """`GET /v1/models/{model}` of the vendor the headers name (Anthropic sends its
        version header)."""
        record = Recorded(path, headers, {})
        with self.lock:
            self.requests.append(record)
            echoed = self._echoed(record)
            if echoed is not None:
                return echoed
            if self.page is not None:
                record.status = self.page_status
                return Answer(self.page_status, html=self.page, cut=self.page_cut)
            fmt = self.formats[0] if "anthropic-version" in headers else self.formats[-1]
            try:
                if not path.startswith("/v1/models/"):
                    raise Rejected(Reply(404, {"error": {"message": f"no route {path}"}}), "404")
                self._refuse_while_down(fmt)
                fmt.check_key(headers)
                answer = Answer(body=fmt.model_info(path.removeprefix("/v1/models/")))
            except Rejected as rejected:
                record.error = rejected.reason
                answer = Answer(rejected.reply.status, rejected.reply.body, rejected.reply.headers)
        record.status = answer.status
        return answer

    def _refuse_while_down(self, fmt: WireFormat) -> None:
        if self.down_status is not None:
            self.outage_hits += 1
            raise Rejected(fmt.outage(self.down_status), f"down ({self.down_status})")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                self._json(server.handle_get(self.path.split("?")[0], headers))

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                headers = {k.lower(): v for k, v in self.headers.items()}
                answer = server.handle(self.path.split("?")[0], headers, body)
                if answer.hold is not None and answer.hold_at is None:
                    answer.hold.wait(60)
                try:
                    if answer.events is not None:
                        self._sse(answer)
                    else:
                        self._json(answer)
                except (BrokenPipeError, ConnectionResetError):
                    if answer.hold is None:
                        raise
                    self.close_connection = True  # the client gave up while it was held
                if server.reset_after_answer:
                    self._reset()

            def _reset(self) -> None:
                """Close the connection with an RST instead of a FIN, after the answer sent."""
                self.wfile.flush()
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
                self.close_connection = True

            def _json(self, answer: Answer) -> None:
                html = answer.html is not None
                data = (answer.html or "").encode() if html else json.dumps(answer.body).encode()
                self.send_response(answer.status)
                self.send_header("content-type", "text/html" if html else "application/json")
                self.send_header("content-length", str(len(data) + (1024 if answer.cut else 0)))
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                if answer.cut:
                    self.close_connection = True

            def _sse(self, answer: Answer) -> None:
                self.send_response(200)
                if server.stream_content_type is not None:
                    self.send_header("content-type", server.stream_content_type)
                self.send_header("connection", "close")
                self.end_headers()
                for i, (name, data) in enumerate(answer.events or []):
                    if i == answer.hold_at and answer.hold is not None:
                        answer.hold.wait(60)
                    chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n"
                    self.wfile.write(chunk.encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler
