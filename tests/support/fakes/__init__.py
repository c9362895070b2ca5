"""Fake model providers for tests: one fake per wire format, one rules table, one server.

`FakeModelServer` hosts the Anthropic Messages fake (`anthropic.py`) and the OpenAI Chat
Completions and Responses fakes (`openai.py`) on one local port; each enforces its documented
rules, looking up what a model accepts in `rules.py`. Use it as a context manager and point the
SDKs at `anthropic_base_url` / `openai_base_url`.
"""

from __future__ import annotations

from collections import deque

from tests.support.fakes.anthropic import (
    BUDGET_TOO_SMALL,
    ENABLED_THINKING_UNSUPPORTED,
    EXPECTED_THINKING,
    MAX_TOKENS_NOT_ABOVE_BUDGET,
    THINKING_WITH_FORCED_TOOL,
    MessagesFake,
    ScriptedTurn,
    anthropic_error,
    anthropic_message,
    rate_limited_anthropic,
    redacted,
    redacted_thinking,
    text,
    thinking,
    tool_use,
)
from tests.support.fakes.openai import (
    ChatFake,
    EmbeddingsFake,
    ResponsesFake,
    chat_completion,
    function_call,
    message,
    openai_error,
    openai_tool_call,
    rate_limited_openai,
    reasoning,
    refusal,
)
from tests.support.fakes.server import BAD_KEY, FakeServer, Recorded, Reply

ANTHROPIC_KEY = "sk-ant-test-key"
OPENAI_KEY = "sk-openai-test-key"

__all__ = [
    "ANTHROPIC_KEY",
    "BAD_KEY",
    "BUDGET_TOO_SMALL",
    "ENABLED_THINKING_UNSUPPORTED",
    "EXPECTED_THINKING",
    "MAX_TOKENS_NOT_ABOVE_BUDGET",
    "OPENAI_KEY",
    "THINKING_WITH_FORCED_TOOL",
    "FakeModelServer",
    "Recorded",
    "Reply",
    "ScriptedTurn",
    "anthropic_error",
    "anthropic_message",
    "chat_completion",
    "function_call",
    "message",
    "openai_error",
    "openai_tool_call",
    "rate_limited_anthropic",
    "rate_limited_openai",
    "reasoning",
    "redacted",
    "redacted_thinking",
    "refusal",
    "text",
    "thinking",
    "tool_use",
]


class FakeModelServer(FakeServer):
    """Every fake wire format on one port.

    `anthropic_key` / `openai_key`: the only key each accepts (None: any key but `BAD_KEY`).
    `signing_key` signs thinking and encrypted reasoning: a server with another key refuses
    what this one signed, as a provider does after a key or model change.
    """

    def __init__(
        self,
        *,
        anthropic_key: str | None = None,
        openai_key: str | None = None,
        signing_key: bytes = b"amc-fake-provider",
        prefix_binding: bool = True,
        require_reasoning_content_back: bool = False,
    ) -> None:
        self.messages = MessagesFake(
            key=anthropic_key, signing_key=signing_key, prefix_binding=prefix_binding
        )
        self.chat = ChatFake(
            key=openai_key, require_reasoning_content_back=require_reasoning_content_back
        )
        self.responses = ResponsesFake(key=openai_key, signing_key=signing_key)
        self.embeddings = EmbeddingsFake(key=openai_key)
        # the OpenAI models endpoint answers from the last format: Responses stays last
        super().__init__([self.messages, self.chat, self.embeddings, self.responses])

    def __enter__(self) -> FakeModelServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- scripting ---
    @property
    def anthropic_script(self) -> deque[ScriptedTurn | Reply]:
        return self.messages.script

    @property
    def responses_script(self) -> deque[ScriptedTurn | Reply]:
        return self.responses.script

    def script_anthropic(self, *answers: ScriptedTurn | Reply) -> None:
        with self.lock:
            self.messages.script.extend(answers)

    def script_openai(self, *replies: Reply) -> None:
        """Chat Completions answers (compact mode)."""
        with self.lock:
            self.chat.script.extend(replies)

    def script_responses(self, *answers: ScriptedTurn | Reply) -> None:
        with self.lock:
            self.responses.script.extend(answers)

    # --- switches tests flip ---
    @property
    def prefix_binding(self) -> bool:
        return self.messages.prefix_binding

    @prefix_binding.setter
    def prefix_binding(self, value: bool) -> None:
        self.messages.prefix_binding = value

    @property
    def require_reasoning_content_back(self) -> bool:
        return self.chat.require_reasoning_content_back

    @require_reasoning_content_back.setter
    def require_reasoning_content_back(self, value: bool) -> None:
        self.chat.require_reasoning_content_back = value
