"""What each model accepts, as the providers document it: the one rules table of the fakes.

Every fake wire format looks a request's model up here (the longest row it falls under at a
boundary of its name, as the planner's tables match: `planner/model_names.py`), so a rule about
a model family is written once. A model the table does not know gets `LENIENT`: the rules every
model shares and nothing model-specific, so tests with made-up model names exercise the
protocol without guessing at a family.

Sources: the Anthropic docs on adaptive thinking, thinking display and prompt caching, and the
OpenAI reasoning guide (see /work/shared/notes/provider-wire-formats.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from planner.model_names import claude_version, family_rows, longest_row

ALL_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
CLAUDE_46_EFFORTS = frozenset({"low", "medium", "high", "max"})
CLAUDE_47_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})
OPENAI_EFFORTS = frozenset({"minimal", "low", "medium", "high"})


@dataclass(frozen=True, slots=True)
class ModelRules:
    """One model family's request rules.

    - `thinking_types`: the `thinking.type` values it accepts (`enabled` = budget form).
    - `thinks_when_omitted`: adaptive thinking is on when `thinking` is left out.
    - `forced_tool_choice`: a forced tool choice (`any` / `tool`) is accepted at all (without
      thinking); Claude Opus 5.5, Sonnet 5.5 and Fable 5.1 refuse it whatever the thinking.
    - `display_default`: thinking text comes back `summarized`, or `omitted` (empty text, the
      signature kept) unless the request asks for `display: "summarized"`.
    - `efforts`: accepted `output_config.effort` / OpenAI reasoning effort levels.
    - `off_efforts`: the efforts `thinking: {type: disabled}` (or `between_tools`) may come
      with, where fewer than `efforts` (Opus 5 and Haiku 5.5 turn thinking off only at effort
      high or below; Sonnet 5.5 takes `between_tools` only at low, medium or high).
    - `reasoning`: OpenAI: accepts `reasoning` (Responses) / `reasoning_effort` (Chat).
    - `parallel_tool_calls`: OpenAI Chat: accepts `parallel_tool_calls` (the o-series answer
      it with 400 "Unsupported parameter: 'parallel_tool_calls' is not supported with this
      model.").
    - `chat_tools_effort`: OpenAI Chat: which `reasoning_effort` may come with function tools.
      `any`; `omitted` (GPT-5.2, 5.4, 5.5: any effort but `none` is refused with tools, "…Please
      use /v1/responses instead."); `none` (gpt-5.6: refused unless it is explicitly `none`,
      also when left out, since the model then reasons at its default effort). Sources:
      openai/openai-openapi#541, pipecat-ai/pipecat#4043, livekit/agents#5088 and #7169,
      BerriAI/litellm#34569, charmbracelet/crush#2913.
    - `min_cache_tokens`: the shortest prefix Anthropic caches for this model.
    - `responses_only`: OpenAI: the model is served by the Responses API alone; Chat
      Completions answers it with 404 "This model is only supported in v1/responses and not in
      v1/chat/completions." (o1-pro, o3-pro: simonw/llm#1169, HeyPuter/puter#1303; the Codex
      and Pro GPT-5 models: ewellnitz/pr-inspection-assistant#43).
    - `streams`: OpenAI: `stream: true` is accepted; o1-pro, o3-pro and the GPT-5 Pro models
      never stream (o1-pro "Streaming is not supported", aipromptshub.co's copy of its model
      page; "Some models, such as gpt-5.5-pro and o3-pro, never stream", docs.auriko.ai):
      400 `unsupported_value`, param `stream`.
    - `max_output_tokens`: the most output a request may ask for (`max_tokens`,
      `max_completion_tokens`, `max_output_tokens`); None: not checked. Model pages: Claude
      Sonnet 4.5 and Opus 4.5 64K; GPT-4o and the GPT-5 chat models 16,384, GPT-4.1 32,768.
    - `text_as_thinking`: Anthropic: the text the model writes before a tool call comes back
      in a thinking block of its own (Claude Opus 5.5, Sonnet 5.5: "text between tool calls
      comes back in thinking blocks"; Fable 5 and 5.1, Mythos 5.1: progress updates), empty
      unless the display returns text.
    - `reasons_when_omitted`: OpenAI Responses: the model reasons when `reasoning` is left out
      (GPT-5 at its default `medium`, the o-series always; GPT-5.1 and later default to
      `none`), so its answer carries reasoning items (without encrypted content unless it was
      included) that a later request must send before the items that followed them.
    """

    thinking_types: frozenset[str] = frozenset({"enabled", "adaptive", "disabled"})
    thinks_when_omitted: bool = False
    forced_tool_choice: bool = True
    display_default: Literal["summarized", "omitted"] = "summarized"
    efforts: frozenset[str] = ALL_EFFORTS
    off_efforts: frozenset[str] | None = None
    reasoning: bool = True
    parallel_tool_calls: bool = True
    chat_tools_effort: Literal["any", "omitted", "none"] = "any"
    min_cache_tokens: int = 1024
    reasons_when_omitted: bool = False
    text_as_thinking: bool = False
    responses_only: bool = False
    max_output_tokens: int | None = None
    streams: bool = True


LENIENT = ModelRules()

# Sonnet 4.5: no effort at all ("This model does not support the effort parameter.").
_BUDGET_ONLY = ModelRules(
    thinking_types=frozenset({"enabled", "disabled"}), efforts=frozenset(), max_output_tokens=64000
)
_CLAUDE_46 = ModelRules(efforts=CLAUDE_46_EFFORTS)
_ADAPTIVE_ONLY = ModelRules(
    thinking_types=frozenset({"adaptive"}),
    display_default="omitted",
    efforts=CLAUDE_47_EFFORTS,
    min_cache_tokens=4096,
)
_ALWAYS_THINKS = ModelRules(
    thinking_types=frozenset({"adaptive"}),
    thinks_when_omitted=True,
    forced_tool_choice=False,
    display_default="omitted",
    efforts=CLAUDE_47_EFFORTS,
    min_cache_tokens=4096,
)
_NO_REASONING = ModelRules(reasoning=False)
_REASONING = ModelRules(efforts=OPENAI_EFFORTS, reasons_when_omitted=True)
# The o-series: no `minimal` (GPT-5's), "Earlier reasoning models like o3 supported only `low`,
# `medium`, and `high`" (OpenAI's GPT-5 notes, quoted in davidmigloz/langchain_dart#760).
_O_SERIES = ModelRules(
    efforts=frozenset({"low", "medium", "high"}),
    parallel_tool_calls=False,
    reasons_when_omitted=True,
)
# GPT-5.1 takes `none` (its default) and no `minimal` ("Unsupported value: 'minimal' is not
# supported with the 'gpt-5.1' model. Supported values are: 'none', 'low', 'medium', and
# 'high'.", openai/openai-agents-python#2089, anomalyco/opencode#4451).
_GPT_51 = ModelRules(efforts=frozenset({"none", "low", "medium", "high"}))
# GPT-5.2 and later take `none` and `xhigh` and no `minimal` (livekit/agents#7169 quotes the
# API's list for gpt-5.6 without the `max` its documentation and later probes show).
_GPT_52_EFFORTS = frozenset({"none", "low", "medium", "high", "xhigh"})
# gpt-5.x-chat-latest: `medium` only ("Unsupported value: 'high' is not supported with the
# 'gpt-5.1-chat-latest' model. Supported values are: 'medium'.", Laisky/one-api#266; the same
# for gpt-5.2-chat-latest, egoist/chatwise-releases#1257).
_CHAT_LATEST = ModelRules(efforts=frozenset({"medium"}), max_output_tokens=16384)
_GPT_54 = ModelRules(efforts=_GPT_52_EFFORTS, chat_tools_effort="omitted")
# GPT-6 models that reason always: `none` and `minimal` refused ("Supported values are: 'low',
# 'medium', 'high', 'xhigh', and 'max'", UKGovernmentBEIS/inspect_ai#5254, live probes), so no
# effort lets function tools through Chat Completions (genkit-ai/genkit-dart#423).
_GPT_6_LOW_FLOOR = ModelRules(
    efforts=frozenset({"low", "medium", "high", "xhigh", "max"}),
    chat_tools_effort="none",
    reasons_when_omitted=True,
)

MODELS: dict[str, ModelRules] = {
    "claude-sonnet-4-5": _BUDGET_ONLY,
    # Opus 4.5: effort low to high (`max` from Opus 4.6), with or without thinking.
    "claude-opus-4-5": ModelRules(
        thinking_types=frozenset({"enabled", "disabled"}),
        efforts=frozenset({"low", "medium", "high"}),
        min_cache_tokens=4096,
        max_output_tokens=64000,
    ),
    "claude-sonnet-4-6": _CLAUDE_46,
    "claude-opus-4-6": ModelRules(efforts=CLAUDE_46_EFFORTS, min_cache_tokens=4096),
    # Claude Opus 4.7 and 4.8: adaptive thinking only, its text omitted by default.
    "claude-opus-4-7": _ADAPTIVE_ONLY,
    "claude-opus-4-8": _ADAPTIVE_ONLY,
    # Claude Opus 5 and Sonnet 5: thinking on by default; `disabled` turns it off, `enabled` is
    # refused. (Opus 5 caches prompts from 512 tokens.)
    "claude-opus-5": ModelRules(
        thinking_types=frozenset({"adaptive", "disabled"}),
        thinks_when_omitted=True,
        display_default="omitted",
        efforts=CLAUDE_47_EFFORTS,
        off_efforts=frozenset({"low", "medium", "high"}),
        min_cache_tokens=512,
    ),
    "claude-sonnet-5": ModelRules(
        thinking_types=frozenset({"adaptive", "disabled"}),
        thinks_when_omitted=True,
        display_default="omitted",
        efforts=CLAUDE_47_EFFORTS,
    ),
    # Claude Opus 5.5, Sonnet 5.5, Fable: thinking always on (also when left out), forced tool
    # use refused.
    "claude-opus-5-5": replace(_ALWAYS_THINKS, text_as_thinking=True),
    # Claude Sonnet 5.5: as Opus 5.5, but `between_tools` turns its up-front thinking off.
    "claude-sonnet-5-5": replace(
        _ALWAYS_THINKS,
        thinking_types=frozenset({"adaptive", "between_tools"}),
        text_as_thinking=True,
        off_efforts=frozenset({"low", "medium", "high"}),
    ),
    # Claude Haiku 5.5: thinks unless told `disabled`; `enabled` is refused.
    "claude-haiku-5-5": ModelRules(
        thinking_types=frozenset({"adaptive", "disabled"}),
        thinks_when_omitted=True,
        display_default="omitted",
        efforts=CLAUDE_47_EFFORTS,
        off_efforts=frozenset({"low", "medium", "high"}),
        min_cache_tokens=512,
    ),
    # Claude Fable 5 and 5.1, Mythos 5.1: the notes they write between tool calls come back as
    # progress-update thinking blocks (the Thinking page, "Progress updates between tool
    # calls").
    "claude-fable": replace(_ALWAYS_THINKS, text_as_thinking=True),
    "claude-mythos-5-1": replace(_ALWAYS_THINKS, text_as_thinking=True),
    # Claude Mythos: adaptive only, and it thinks when `thinking` is left out.
    "claude-mythos": ModelRules(
        thinking_types=frozenset({"adaptive"}),
        thinks_when_omitted=True,
        display_default="omitted",
        efforts=CLAUDE_47_EFFORTS,
        min_cache_tokens=4096,
    ),
    "gpt-4.1": replace(_NO_REASONING, max_output_tokens=32768),
    "gpt-4o": replace(_NO_REASONING, max_output_tokens=16384),
    "o1": _O_SERIES,
    "o3": _O_SERIES,
    "o4-mini": _O_SERIES,
    # o1-pro and o3-pro: the Responses API only (their model pages).
    "o1-pro": replace(_O_SERIES, responses_only=True, streams=False),
    "o3-pro": replace(_O_SERIES, responses_only=True, streams=False),
    "gpt-5": _REASONING,
    # gpt-5-pro: `high` only, its default (anomalyco/opencode#3474, #26268: "bare `gpt-5-pro`
    # only supports `high`", checked against the live Responses API's errors).
    "gpt-5-pro": ModelRules(
        efforts=frozenset({"high"}), reasons_when_omitted=True, responses_only=True, streams=False
    ),
    "gpt-5.1": _GPT_51,
    # gpt-5.1-codex-max: gpt-5.1's efforts and `xhigh` (openai/codex docs/config.md).
    "gpt-5.1-codex-max": replace(_GPT_51, efforts=_GPT_51.efforts | {"xhigh"}, responses_only=True),
    # The Codex models reason always: no `none` (openai/codex#6647: "'none' is not supported
    # with the 'gpt-5.1-codex' model. Supported values are: 'low', 'medium', and 'high'");
    # gpt-5.1-codex-mini medium and high only; gpt-5.2/5.3-codex low to xhigh.
    "gpt-5.1-codex": replace(
        _GPT_51, efforts=frozenset({"low", "medium", "high"}), responses_only=True
    ),
    # gpt-5-codex: low, medium, high ("Unsupported value: 'minimal' is not supported with the
    # 'gpt-5-codex' model. Supported values are: 'low', 'medium', and 'high'.").
    "gpt-5-codex": replace(
        _REASONING, efforts=frozenset({"low", "medium", "high"}), responses_only=True
    ),
    "gpt-5.1-codex-mini": replace(
        _GPT_51, efforts=frozenset({"medium", "high"}), responses_only=True
    ),
    "gpt-5.2-codex": replace(_GPT_54, efforts=_GPT_52_EFFORTS - {"none"}, responses_only=True),
    "gpt-5.3-codex": replace(_GPT_54, efforts=_GPT_52_EFFORTS - {"none"}, responses_only=True),
    # gpt-5.2-pro: medium, high, xhigh, as the API answers anything else ("Unsupported value:
    # 'none' is not supported with the 'gpt-5.2-pro' model. Supported values are: 'medium',
    # 'high', and 'xhigh'.", pydantic/pydantic-ai's live probes of the Responses API). Whether
    # it streams and whether Chat Completions serves it is not documented: not checked.
    "gpt-5.2-pro": replace(_GPT_54, efforts=frozenset({"medium", "high", "xhigh"})),
    # gpt-5.4-pro, gpt-5.5-pro: medium, high, xhigh (their model pages, anomalyco/models.dev#2296).
    "gpt-5.4-pro": replace(
        _GPT_54,
        efforts=frozenset({"medium", "high", "xhigh"}),
        responses_only=True,
        streams=False,
    ),
    "gpt-5.5-pro": replace(
        _GPT_54,
        efforts=frozenset({"medium", "high", "xhigh"}),
        responses_only=True,
        streams=False,
    ),
    "gpt-5.1-chat": _CHAT_LATEST,
    "gpt-5.2-chat": _CHAT_LATEST,
    "gpt-5.3-chat": _CHAT_LATEST,
    "gpt-5.2": _GPT_54,
    "gpt-5.4": _GPT_54,
    "gpt-5.5": _GPT_54,
    # gpt-5.6 (Sol, Terra, Luna): `max` too (its model docs; mnfst/modelparams.dev#86).
    "gpt-5.6": ModelRules(efforts=_GPT_52_EFFORTS | {"max"}, chat_tools_effort="none"),
    # GPT-6 (gpt-6-sol, gpt-6-astra, …): as gpt-5.6 on Chat Completions ("Function tools with
    # reasoning_effort are not supported for gpt-6-sol in /v1/chat/completions. To use function
    # tools, use /v1/responses or set reasoning_effort to 'none'.", onyx-dot-app/onyx#15008;
    # gpt-6-astra also without the parameter, can1357/oh-my-pi#11052, Wei-Shaw/sub2api#6740).
    "gpt-6": ModelRules(chat_tools_effort="none"),
    "gpt-6-astra": _GPT_6_LOW_FLOOR,
    # gpt-6.1-sol, gpt-6.2-astra and gpt-6.2-sol reason always too: low to max, `none` refused
    # (the GPT-6.2 Sol model page: "The API rejects requests that set reasoning effort to
    # none"; GPT-6.1 Sol "does not accept none or minimal", its migration notes).
    "gpt-6.1-sol": _GPT_6_LOW_FLOOR,
    "gpt-6.2-astra": _GPT_6_LOW_FLOOR,
    "gpt-6.2-sol": _GPT_6_LOW_FLOOR,
    "gpt-5-chat": replace(_NO_REASONING, max_output_tokens=16384),
}


def rules_for(model: str) -> ModelRules:
    """The rules of `model`: the longest entry it falls under at a boundary of its name, as the
    planner's own tables match (gpt-5.10 is no gpt-5.1), else LENIENT. A Claude version newer
    than every listed one of its family (claude-opus-5-7) behaves as the family's newest
    (what the planner assumes of it too), not as the row its name merely starts with
    (claude-opus-5)."""
    parsed = claude_version(model)
    listed = family_rows(parsed[0], MODELS) if parsed is not None else {}
    if parsed is not None and listed and all(v < parsed[1] for v in listed):
        return MODELS[listed[max(listed)]]
    row = longest_row(model, MODELS)
    return MODELS[row] if row is not None else LENIENT
