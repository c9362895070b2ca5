"""The provider protocol and the normalized request/response every provider speaks.

A provider turns one `ProviderRequest` into one `ProviderResponse`; it knows its wire format and
nothing about retries for bad tool calls (that is `Planner`'s job). A response keeps the
provider's own assistant content in `raw_assistant` so a follow-up turn (the corrective retry)
can send it back exactly as the provider requires, thinking signatures and redacted blocks
included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from planner.decision import ThinkingBlock, Usage
from planner.tools import ToolSpec

ToolChoice = Literal["auto", "required"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call. `arguments` is None when the provider sent arguments that are not JSON."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str = ""


@dataclass(slots=True)
class ProviderResponse:
    """One model answer, normalized."""

    text: list[str]
    thinking: list[ThinkingBlock]
    tool_calls: list[ToolCall]
    usage: Usage
    model: str
    stop_reason: str | None
    raw_assistant: Any = None

    @property
    def rationale(self) -> str | None:
        """The text blocks joined: the model's judgement of the last step and its intent."""
        joined = "\n".join(t.strip() for t in self.text if t.strip())
        return joined or None


@dataclass(frozen=True, slots=True)
class UserTurn:
    """A user message; `screenshot` (PNG or JPEG bytes) is attached as an image when given."""

    text: str
    screenshot: bytes | None = None


@dataclass(frozen=True, slots=True)
class AssistantTurn:
    """A previous answer, sent back verbatim (via `response.raw_assistant`)."""

    response: ProviderResponse


@dataclass(frozen=True, slots=True)
class ToolResultTurn:
    """The result of a tool call; `is_error` for the corrective retry's complaint."""

    call_id: str
    content: str
    is_error: bool = False


Message = UserTurn | AssistantTurn | ToolResultTurn


@dataclass(slots=True)
class ProviderRequest:
    """One call. `thinking` False turns reasoning off for this call (the forced retry needs it)."""

    system: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    tool_choice: ToolChoice = "auto"
    thinking: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Provider(Protocol):
    """A model behind one wire format. `name` is "anthropic", "openai" or "offline"."""

    @property
    def name(self) -> str: ...

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        """One model call. Raises `planner.errors.PlannerError` subclasses on provider failure."""
        ...

    async def aclose(self) -> None:
        """Release the HTTP client."""
        ...


def image_media_type(data: bytes) -> str:
    """PNG or JPEG by magic number (the two formats the Decide contract allows)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/png"
