"""Planner configuration from the environment (prefix `AMC_PLANNER_`).

Provider choice: `AMC_PLANNER_PROVIDER` wins when set. Left unset, the planner uses Anthropic when
an Anthropic key is configured, else OpenAI when an OpenAI key is, else the offline provider, so
the embedded stack runs anywhere and a key is all it takes to use a real model.

Thinking (Anthropic): `off` (default), `adaptive` (`thinking: {type: adaptive}` plus the optional
`effort`, the form newer Claude models require) or `budget` (`thinking: {type: enabled,
budget_tokens: N}` for models that still take it), `AMC_PLANNER_EFFORT` sent with any of them
(effort governs all of a Claude answer, thinking or not); OpenAI takes `adaptive` as its reasoning
effort, with summaries unless `AMC_PLANNER_REASONING_SUMMARY=off`, and `off` as the least
effort the model takes (`off_effort` in planner/model_profiles.py). The seed design's
`AI_PLANNER_THINKING_BUDGET_TOKENS` still works: it sets the budget and, when no mode is given,
selects `budget`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from telemetry.redaction import KeepsSecrets

ProviderName = Literal["offline", "anthropic", "openai"]
ThinkingMode = Literal["off", "adaptive", "budget"]
#: Every effort level a provider takes (Claude: low…max; OpenAI: openai-python's
#: `ReasoningEffort`, none…max). Which ones a model takes is its profile's to say
#: (`planner/model_profiles.py`), refused at start with the levels it does take.
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
ThinkingDisplay = Literal["summarized", "updates"]

DEFAULT_MODELS: dict[str, str] = {
    "anthropic": "claude-sonnet-4-6",
    # The model OpenAI's models page names for balancing intelligence and cost (reasoning,
    # function tools through Responses; `thinking: off` asks it for its least effort, low).
    "openai": "gpt-6.2-sol",
    "offline": "amc-offline-heuristic-1",
}
MIN_THINKING_BUDGET = 1024
# Compact mode does not stream. Its calls get a timeout derived from max_tokens the way the
# Anthropic SDK estimates one (an hour per 128k output tokens; planner/vendors/streaming.py),
# and budget + the answer's room stays below ~21k tokens so that estimate stays under ten
# minutes. (The SDK's own refusal of such calls applies only to a client on its default
# timeout, which the planner's clients never are.)
MAX_THINKING_BUDGET = 20000
ANSWER_ROOM_TOKENS = 1024
#: The most output one call asks for (the largest budget with the answer's room, ~590 s).
MAX_CALL_TOKENS = MAX_THINKING_BUDGET + ANSWER_ROOM_TOKENS
# Thinking counts toward the output limit (Anthropic `max_tokens`, OpenAI `max_output_tokens` /
# `max_completion_tokens`), and adaptive or always-on thinking has no budget to size it by: a
# call that thinks gets at least this many tokens, so the default 2,048 does not cut the model
# off mid-thought before its tool call (~450 s by the SDK's estimate, under MAX_CALL_TOKENS).
THINKING_MAX_TOKENS = 16000


class PlannerSettings(KeepsSecrets, BaseSettings):
    """Everything the planner reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="AMC_PLANNER_", extra="ignore")

    provider: ProviderName | None = None
    model: str | None = None
    thinking: ThinkingMode | None = None
    effort: Effort | None = None
    # OpenAI reasoning summaries (session mode, Responses): `auto` asks for them (readable
    # thinking in the decision log); `off` does not — what an organisation OpenAI has not
    # verified needs (it gets 400 "Your organization must be verified to generate reasoning
    # summaries" otherwise). The encrypted reasoning round-trips either way.
    reasoning_summary: Literal["auto", "off"] = "auto"
    # The Claude models that return the text they write before a tool call in thinking blocks
    # of their own (`text_as_thinking` in planner/model_profiles.py): `summarized` keeps their
    # reasoning readable, live and in the decision log (the rationale read by block order);
    # `updates` reads the rationale exactly, and their reasoning comes back empty.
    thinking_display: ThinkingDisplay = "summarized"
    thinking_budget_tokens: int | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "AMC_PLANNER_THINKING_BUDGET_TOKENS",
            "AI_PLANNER_THINKING_BUDGET_TOKENS",
            "thinking_budget_tokens",
        ),
    )
    max_tokens: int = Field(default=2048, ge=64, le=20000)
    transport: Literal["direct", "cloud"] = "direct"
    anthropic_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "AMC_PLANNER_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY", "anthropic_api_key"
        ),
    )
    openai_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "AMC_PLANNER_OPENAI_API_KEY", "OPENAI_API_KEY", "openai_api_key"
        ),
    )
    anthropic_base_url: str | None = None
    openai_base_url: str | None = None
    # How often one decision's model calls are asked again in all after a 429, 5xx or lost
    # connection, within bounded waits (planner/vendors/failures.py: RETRY_WAIT_LIMIT_S):
    # shared by a decision's calls (a retry without a tool call, a corrective turn).
    max_retries: int = Field(default=2, ge=0, le=10)
    timeout_s: float = Field(default=60.0, gt=0)
    history_window: int = Field(default=20, ge=1)
    # Compact mode: the step's screenshot goes to the model too, within the provider's image
    # limit (re-encoded at the screen's size where needed: planner/vendors/images.py).
    send_screenshot: bool = False
    # A model profile by name (`planner/model_profiles.py`), for a model the table does not know
    # or knows wrong; unset, the profile is looked up by the model's name.
    model_profile: str | None = None
    # Anthropic prompt caching: breakpoints on the system prompt and tools (both modes) and on
    # the conversation prefix (session mode), so a long task pays full input price once.
    prompt_cache: bool = True
    # Prices per model (planner/prices.py) are list prices; a TOML or JSON file of
    # `models."<name prefix>" = {input, output, cache_read, cache_write}` rows (USD per million
    # tokens) overrides or adds rows.
    prices_file: Path | None = None

    # Planning mode: `compact` sends one compact record per past step; `session` keeps a real
    # multi-turn conversation (with reasoning round-tripped exactly) — see planner/session/.
    mode: Literal["compact", "session"] = "compact"
    session_keep_scenes: int | None = Field(default=6, ge=1)
    session_keep_reasoning_turns: int | None = Field(default=None, ge=1)
    session_foreign_reasoning: Literal["drop", "text"] = "drop"
    # Streaming is on by default: it is how consoles see the model think live. Off, each call
    # gets the timeout its max_tokens may need (as compact calls do).
    session_stream: bool = True

    @model_validator(mode="after")
    def _check_thinking(self) -> PlannerSettings:
        if self.thinking is None:
            self.thinking = "budget" if self.thinking_budget_tokens else "off"
        if self.thinking == "budget":
            if self.thinking_budget_tokens is None:
                raise ValueError("thinking=budget needs AMC_PLANNER_THINKING_BUDGET_TOKENS")
            if self.thinking_budget_tokens < MIN_THINKING_BUDGET:
                raise ValueError(
                    f"thinking budget must be at least {MIN_THINKING_BUDGET} tokens, "
                    f"got {self.thinking_budget_tokens}"
                )
            if self.thinking_budget_tokens > MAX_THINKING_BUDGET:
                raise ValueError(
                    f"thinking budget above {MAX_THINKING_BUDGET} tokens needs streaming, "
                    f"which the planner does not use; got {self.thinking_budget_tokens}"
                )
        return self

    @property
    def resolved_provider(self) -> ProviderName:
        """The provider in use: explicit, else by which API key is present, else offline."""
        if self.provider is not None:
            return self.provider
        if self.anthropic_api_key is not None and self.anthropic_api_key.get_secret_value():
            return "anthropic"
        if self.openai_api_key is not None and self.openai_api_key.get_secret_value():
            return "openai"
        return "offline"

    @property
    def resolved_model(self) -> str:
        return self.model or DEFAULT_MODELS[self.resolved_provider]

    @property
    def thinking_mode(self) -> ThinkingMode:
        return self.thinking or "off"

    @property
    def effective_max_tokens(self) -> int:
        """`max_tokens`, raised above the budget in budget mode (the API rejects it otherwise).

        The floor is budget + 1024 rather than budget + 1 so the tool call itself still fits.
        (A call with adaptive thinking or OpenAI reasoning is raised to THINKING_MAX_TOKENS
        where its request is built, so a call without thinking keeps this limit.)
        """
        if self.thinking_mode == "budget" and self.thinking_budget_tokens is not None:
            return max(self.max_tokens, self.thinking_budget_tokens + ANSWER_ROOM_TOKENS)
        return self.max_tokens
