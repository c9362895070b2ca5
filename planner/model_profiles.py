"""What each model family accepts: the one table requests are built from.

Providers change what their models take faster than any request code can follow: Claude Opus 4.7
refuses the budget form of thinking (and `{type: disabled}`), returns empty thinking unless asked
for a summary, and cannot combine a forced tool choice with thinking; Claude Opus 5 thinks
unless told `{type: disabled}`; Opus 5.5 always thinks and refuses any forced tool choice;
OpenAI's GPT-4.1 refuses the reasoning parameters its o-series and GPT-5 need. Every such rule
lives in `PROFILES`, and the vendor adapters build each request from the profile of the
configured model, so a new model is one table row.

A versioned Claude name newer than every listed version of its family gets `claude-newer` (as
the newest documented models: adaptive only, always thinking, no forced tool choice), reading
answers as its family's newest listed model does; one between listed versions the profile of
the nearest one below. Any other model the table does not know gets its vendor's conservative
profile (`anthropic-unknown`, `openai-unknown`): the request carries what the settings ask for
and nothing the table would add (no display field, no explicit `disabled`), and nothing is
refused. An operator who knows better names a profile with `AMC_PLANNER_MODEL_PROFILE`. A
configuration the model cannot take is refused at start with one line (`check`), not by the
provider at the first step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from planner.errors import PlannerConfigError
from planner.model_names import claude_version, family_rows, longest_row
from planner.settings import PlannerSettings, ThinkingDisplay

ThinkingMode = Literal["off", "adaptive", "budget"]
ThinkingOff = Literal["omit", "disabled", "between_tools"]
Display = Literal["summarized", "omitted", "updates"]
RetryForm = Literal["forced", "nudge"]

INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
THINKING_DISPLAY_UPDATES_BETA = "thinking-display-updates-2026-08-18"
# Claude Opus 4.6 and Sonnet 4.6: low to max, no xhigh. Sources conflict on Sonnet 4.6's `max`:
# the effort page at the 4.6 launch said "max … Opus 4.6 only. Requests using max on other
# models will return an error"; the page as revised since (Opus 4.7 and later) lists `max` as
# available on "… Opus 4.6, Sonnet 5, Sonnet 4.6" and `xhigh` not on either 4.6 model. The
# current page is followed.
CLAUDE_EFFORTS = frozenset({"low", "medium", "high", "max"})
CLAUDE_47_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})
# OpenAI reasoning efforts per family. The API's own reference (the `reasoning_effort`
# docstring of the OpenAI SDKs, generated from it): "gpt-5.1 defaults to none … The supported
# reasoning values for gpt-5.1 are none, low, medium, and high"; "All models before gpt-5.1
# default to medium reasoning effort, and do not support none"; "xhigh is supported for all
# models after gpt-5.1-codex-max". The API refuses `minimal` on gpt-5.1 ("…Supported values are:
# 'none', 'low', 'medium', and 'high'.", openai/openai-agents-python#2089) and on gpt-5.6
# (livekit/agents#7169, whose quoted list lacks the `max` gpt-5.6 takes: GPT_56_EFFORTS),
# and everything but `medium` on gpt-5.1-chat-latest and gpt-5.2-chat-latest ("Supported values
# are: 'medium'.", Laisky/one-api#266, egoist/chatwise-releases#1257).
OPENAI_EFFORTS = frozenset({"minimal", "low", "medium", "high"})
# The o-series (o1, o3, o4-mini) came before `minimal` (GPT-5's): low, medium and high only
# ("Earlier reasoning models like o3 supported only `low`, `medium`, and `high`", the GPT-5
# launch notes; the model tables of OpenAI's reasoning guide).
O_SERIES_EFFORTS = frozenset({"low", "medium", "high"})
GPT_51_EFFORTS = frozenset({"none", "low", "medium", "high"})
GPT_52_EFFORTS = frozenset({"none", "low", "medium", "high", "xhigh"})
# The GPT-5.6 family (Sol, Terra, Luna) adds `max` (its model docs: "`reasoning.effort`, with
# values none, low, medium, high, xhigh, and max"; mnfst/modelparams.dev#86, enricoros/big-AGI
# #1159 probing the live API); gpt-5.2 to 5.5 refuse it.
GPT_56_EFFORTS = GPT_52_EFFORTS | {"max"}
ANY_EFFORT = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What one model family accepts.

    - `thinking_modes`: the configured thinking forms it takes (`budget`: Anthropic
      `{type: enabled, budget_tokens}`; `adaptive`: `{type: adaptive}` for Anthropic, reasoning
      effort for OpenAI). Empty: it does not reason at all.
    - `thinking_off`: how a call without thinking is sent (`omit` the field, or say
      `{type: disabled}` or, on Claude Sonnet 5.5, `{type: between_tools}`: no up-front
      thinking); None: the model always thinks (thinking "off" is refused at start).
    - `off_per_call`: one call may run without thinking while the conversation thinks (what a
      forced retry needs). False: the retry is a nudge with thinking kept.
    - `forced_tool_choice`: a forced tool choice is accepted (without thinking).
    - `display_default` / `visible_display`: what the provider does with thinking text by
      default, and the `display` value that makes it readable (None: send nothing; `updates`:
      only the model's text, see `text_as_thinking`).
    - `readable_thinking`: what a readable thinking block is on this model (a summary on
      Claude 4 and later; OpenAI summaries) — recorded as the decision's thinking kind.
    - `efforts`: accepted effort levels (Anthropic sends the effort with any thinking, or
      none: it governs every output token; beside a budget the API applies both);
      `beta_headers`: per thinking mode.
    - `off_efforts`: Anthropic — the efforts a call with thinking turned off (`thinking_off`)
      takes, where fewer than `efforts` (None: all of them).
    - `default_effort`: OpenAI — the reasoning effort asked for when `AMC_PLANNER_EFFORT` is
      not set (one of `efforts`: gpt-5-pro takes `high` only).
    - `reasoning`: OpenAI only — accepts `reasoning` / `reasoning_effort`.
    - `off_effort`: OpenAI reasoning models — the effort sent for thinking "off", the least
      the model takes. Left out, such a model reasons at its default effort (hidden, billed,
      and inside the answer's output budget, which cut answers off): `none` does not reason
      (gpt-5.1 and later); any other effort still does and gets room for it. None: left out
      (a model not in the table).
    - `parallel_tool_calls`: OpenAI Chat Completions — accepts the `parallel_tool_calls`
      parameter (the o-series answer it with 400 "Unsupported parameter"; it is then left out
      and an extra call is answered "not executed").
    - `chat_tools`: OpenAI — compact mode may use Chat Completions. False for the GPT-5
      family: GPT-5.4 refuses function tools there with a reasoning effort ("Function tools
      with reasoning_effort are not supported for gpt-5.4 in /v1/chat/completions. Please use
      /v1/responses instead.", openai/openai-openapi#541), gpt-5.6 unless the effort is
      explicitly `none` (BerriAI/litellm#34569); its compact steps then use the stateless
      Responses API, as session mode does (which has no such restriction).
    - `max_output_tokens`: the model's output limit (None: not known).
    - `tools`: the model takes function tools. The planner acts only through them, so a model
      that does not (gpt-5-chat-latest, o1-mini: 400 "tools is not supported in this model")
      is refused at start.
    - `vision`: the model takes image input; without it a screenshot
      (`AMC_PLANNER_SEND_SCREENSHOT`) is refused at start (o3-mini, o1-mini).
    - `streams`: the model answers a streamed request (o1-pro, o3-pro and the GPT-5 `-pro`
      models never stream): False, session mode asks it unstreamed, and its thinking is not
      shown live.
    - `prompt_cache`: Anthropic prompt caching with explicit breakpoints.
    - `text_as_thinking`: Anthropic — the text the model writes before a tool call comes back
      in a thinking block of its own, a progress update (Claude Opus 5.5 and Sonnet 5.5: "text
      between tool calls comes back in thinking blocks"; Fable 5 and 5.1, Mythos 5.1). Under
      `summarized` display (the default) such a block is "not distinguishable from a reasoning
      block" (the Thinking page), and either may be skipped, so the decision reads it by its
      place (`Turn.said`); `AMC_PLANNER_THINKING_DISPLAY=updates` asks for `display:
      "updates"` (beta, `with_display`): every readable block is then the model's text, read
      exactly, and the reasoning summaries no longer come back.
    """

    name: str
    vendor: Literal["anthropic", "openai"]
    thinking_modes: frozenset[ThinkingMode]
    thinking_off: ThinkingOff | None = "omit"
    off_per_call: bool = True
    forced_tool_choice: bool = True
    display_default: Display | None = None
    visible_display: Display | None = None
    readable_thinking: Literal["full", "summarized"] = "summarized"
    efforts: frozenset[str] = ANY_EFFORT
    off_efforts: frozenset[str] | None = None
    default_effort: str = "medium"
    beta_headers: Mapping[str, str] = field(default_factory=dict)
    reasoning: bool = False
    off_effort: str | None = None
    parallel_tool_calls: bool = True
    chat_tools: bool = True
    max_output_tokens: int | None = None
    tools: bool = True
    vision: bool = True
    streams: bool = True
    prompt_cache: bool = False
    text_as_thinking: bool = False

    def retry_form(self, thinking: bool) -> RetryForm:
        """How a turn without a tool call is asked again: a forced tool choice where the model
        takes one (with thinking off for that call, when it thinks), else a nudge."""
        if not self.forced_tool_choice:
            return "nudge"
        if thinking and self.vendor == "anthropic" and not self.off_per_call:
            return "nudge"
        return "forced"


_BUDGET = {"budget": INTERLEAVED_THINKING_BETA}

# Claude Opus 5.5, Sonnet 5.5, Fable, Mythos: adaptive thinking always on (also when `thinking`
# is left out; `disabled` and `enabled` are 400s), so thinking "off" is refused at start; a
# forced tool choice is an error whatever the thinking.
_ALWAYS_THINKS = ModelProfile(
    "claude-always-thinks",
    "anthropic",
    frozenset({"adaptive"}),
    thinking_off=None,
    off_per_call=False,
    forced_tool_choice=False,
    display_default="omitted",
    visible_display="summarized",
    efforts=CLAUDE_47_EFFORTS,
    max_output_tokens=128000,
    prompt_cache=True,
)

_TEXT_AS_THINKING = replace(_ALWAYS_THINKS, name="claude-opus-5.5", text_as_thinking=True)

# The GPT-5 family (and GPT-6) writes up to 128,000 output tokens (their model pages: "128,000
# max output tokens"; the o-series 100,000, gpt-5-pro 272,000).
_GPT_5 = ModelProfile(
    "openai-reasoning",
    "openai",
    frozenset({"adaptive"}),
    efforts=OPENAI_EFFORTS,
    reasoning=True,
    off_effort="minimal",
    chat_tools=False,
    max_output_tokens=128000,
)

# o1, o3, o4-mini: as GPT-5 with the o-series' efforts (no `minimal`: thinking off is asked
# `low`), and Chat Completions refuses `parallel_tool_calls`. The base of the o-series rows.
_O_SERIES = ModelProfile(
    "openai-o-series",
    "openai",
    frozenset({"adaptive"}),
    efforts=O_SERIES_EFFORTS,
    reasoning=True,
    off_effort="low",
    parallel_tool_calls=False,
    max_output_tokens=100000,
)

# Claude Sonnet 4.5, Haiku 4.5 and the Claude 4 models before them: budget thinking only, and
# no effort ("This model does not support the effort parameter.", anthropics/claude-code#30795).
_CLAUDE_BUDGET = ModelProfile(
    "claude-budget",
    "anthropic",
    frozenset({"budget"}),
    display_default="summarized",
    efforts=frozenset(),
    beta_headers=_BUDGET,
    max_output_tokens=64000,
    prompt_cache=True,
)

PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        _CLAUDE_BUDGET,
        # Claude Opus 4 and 4.1: as those, writing at most 32K output tokens (their model pages:
        # "Max output: 32K tokens"; the other Claude 4 models write 64K).
        replace(_CLAUDE_BUDGET, name="claude-opus-4", max_output_tokens=32000),
        # Claude Opus 4.5: as those, and it takes an effort, low to high (the effort page:
        # "supported by Claude Opus 4.6 and Claude Opus 4.5", `max` only from Opus 4.6), which
        # the API applies with the thinking budget (effort governs every output token).
        replace(
            _CLAUDE_BUDGET, name="claude-opus-4.5", efforts=frozenset({"low", "medium", "high"})
        ),
        # Claude Sonnet 4.6 and Opus 4.6: adaptive (recommended) or the deprecated budget form;
        # `{type: disabled}` is accepted and said explicitly. Both write up to 128K output
        # tokens (their model pages: "Max output: 128K tokens").
        ModelProfile(
            "claude-4.6",
            "anthropic",
            frozenset({"adaptive", "budget"}),
            thinking_off="disabled",
            display_default="summarized",
            efforts=CLAUDE_EFFORTS,
            beta_headers=_BUDGET,
            max_output_tokens=128000,
            prompt_cache=True,
        ),
        # Claude Opus 4.7 and 4.8: adaptive only; `enabled` and `disabled` are 400s, a forced
        # tool choice cannot be combined with thinking, thinking text is omitted unless
        # summarized display is asked for. Left out, thinking is off.
        ModelProfile(
            "claude-adaptive-only",
            "anthropic",
            frozenset({"adaptive"}),
            off_per_call=False,
            display_default="omitted",
            visible_display="summarized",
            efforts=CLAUDE_47_EFFORTS,
            max_output_tokens=128000,
            prompt_cache=True,
        ),
        # Claude Opus 5, Sonnet 5 and Haiku 5.5: adaptive thinking is on when `thinking` is
        # left out ("thinking on by default"), `enabled` is a 400, and thinking is turned off
        # only by saying `{type: disabled}` (on Opus 5 and Haiku 5.5 accepted at effort high or
        # below — the default — so one call of a thinking conversation does not turn it off:
        # the retry is a nudge; with thinking off an effort above high is refused at start).
        ModelProfile(
            "claude-5",
            "anthropic",
            frozenset({"adaptive"}),
            thinking_off="disabled",
            off_efforts=frozenset({"low", "medium", "high"}),
            off_per_call=False,
            display_default="omitted",
            visible_display="summarized",
            efforts=CLAUDE_47_EFFORTS,
            max_output_tokens=128000,
            prompt_cache=True,
        ),
        _ALWAYS_THINKS,
        # Claude Opus 5.5: as the models that always think, and the text it writes before a
        # tool call comes back in a thinking block (its what's-new page: "text between tool
        # calls comes back in thinking blocks whose text is empty at the default display").
        _TEXT_AS_THINKING,
        # Claude Sonnet 5.5: as Opus 5.5, but its up-front thinking is turned off by saying
        # `{type: between_tools}` (`disabled` is refused; any short progress note it writes
        # between tool calls still comes back in a thinking block: the SDK's ThinkingTypes),
        # at effort low, medium or high only ("At xhigh or max effort, a request with
        # between_tools returns a 400 error": What's new in Claude Sonnet 5.5).
        replace(
            _TEXT_AS_THINKING,
            name="claude-sonnet-5.5",
            thinking_off="between_tools",
            off_efforts=frozenset({"low", "medium", "high"}),
        ),
        # Claude Fable 5 and 5.1, Mythos 5.1: as the models that always think, and the notes
        # they write between tool calls come back as progress-update thinking blocks (the
        # Thinking page, "Progress updates between tool calls").
        replace(_TEXT_AS_THINKING, name="claude-progress-updates"),
        # A Claude version newer than this table (claude-opus-5-7, claude-haiku-6): treated as
        # the newest documented models behave (as `claude-always-thinks`), so a model that
        # thinks although told nothing is never taken for one that does not; its answers are
        # read as its family's newest model's are (`_by_version`). An operator who knows it can
        # run without thinking names another profile.
        replace(_ALWAYS_THINKS, name="claude-newer", max_output_tokens=None),
        ModelProfile(
            "anthropic-unknown",
            "anthropic",
            frozenset({"adaptive", "budget"}),
            beta_headers=_BUDGET,
            prompt_cache=True,
        ),
        # GPT-4.1 and GPT-4o: no reasoning parameters at all.
        ModelProfile("gpt-4.1", "openai", frozenset(), max_output_tokens=32768),
        ModelProfile("gpt-4o", "openai", frozenset(), max_output_tokens=16384),
        # gpt-5-chat(-latest): a GPT-5 name without reasoning parameters, writing at most
        # 16,384 output tokens (its model page), as the gpt-5.x-chat-latest models below, and
        # taking no function tools: 400 "tools is not supported in this model" (BerriAI/litellm
        # #13612, sbintuitions/flexeval#242; Azure's gpt-5-chat: "does not support function
        # calling", anomalyco/opencode#1918), so it cannot plan at all.
        ModelProfile("gpt-5-chat", "openai", frozenset(), max_output_tokens=16384, tools=False),
        # GPT-5 (and -mini, -nano): reasoning effort and summaries; compact steps through
        # Responses.
        _GPT_5,
        # gpt-5-pro: reasoning effort `high` only, its default (anomalyco/opencode#3474 and
        # #26268, checked against the Responses API's errors; the versioned Pro models of
        # later GPT-5 versions take more and are left to their version's row).
        replace(
            _GPT_5,
            name="gpt-5-pro",
            efforts=frozenset({"high"}),
            default_effort="high",
            off_effort="high",
            streams=False,
            max_output_tokens=272000,
        ),
        replace(_GPT_5, name="gpt-5.1", efforts=GPT_51_EFFORTS, off_effort="none"),
        # gpt-5.1-codex-max: gpt-5.1's efforts and `xhigh` (openai/codex docs/config.md: "xhigh
        # (available only on gpt-5.1-codex-max)"; the API reference: "xhigh is supported for all
        # models after gpt-5.1-codex-max").
        replace(
            _GPT_5, name="gpt-5.1-codex-max", efforts=GPT_51_EFFORTS | {"xhigh"}, off_effort="none"
        ),
        replace(_GPT_5, name="gpt-5.2+", efforts=GPT_52_EFFORTS, off_effort="none"),
        replace(_GPT_5, name="gpt-5.6", efforts=GPT_56_EFFORTS, off_effort="none"),
        # The Codex models reason always: no `none` ("'none' is not supported with the
        # 'gpt-5.1-codex' model. Supported values are: 'low', 'medium', and 'high'", an OpenAI
        # maintainer in openai/codex#6647), and gpt-5-codex takes those three too (no GPT-5
        # `minimal`: "Unsupported value: 'minimal' is not supported with the 'gpt-5-codex'
        # model. Supported values are: 'low', 'medium', and 'high'.", the API's error as agent
        # frameworks quote it; models.dev lists the same); gpt-5.1-codex-mini takes medium and
        # high only; gpt-5.2-codex and gpt-5.3-codex low to xhigh (no `minimal`:
        # earendil-works/pi#1334).
        replace(
            _GPT_5,
            name="gpt-5.1-codex",
            efforts=frozenset({"low", "medium", "high"}),
            off_effort="low",
        ),
        replace(
            _GPT_5,
            name="gpt-5.1-codex-mini",
            efforts=frozenset({"medium", "high"}),
            off_effort="medium",
        ),
        replace(
            _GPT_5,
            name="gpt-5.x-codex",
            efforts=GPT_52_EFFORTS - {"none"},
            off_effort="low",
        ),
        # gpt-5.2-pro, gpt-5.4-pro and gpt-5.5-pro: medium, high and xhigh (their model pages,
        # as anomalyco/models.dev#2296 cites them; "Unsupported value: 'none' is not supported
        # with the 'gpt-5.2-pro' model. Supported values are: 'medium', 'high', and 'xhigh'.",
        # the live API in pydantic/pydantic-ai's probes). Never asked to stream, as the other
        # Pro models: whether gpt-5.2-pro streams is not documented, and unstreamed is always
        # accepted.
        replace(
            _GPT_5,
            name="gpt-5.x-pro",
            efforts=frozenset({"medium", "high", "xhigh"}),
            off_effort="medium",
            streams=False,
        ),
        # GPT-6 (gpt-6-sol, gpt-6-luna, gpt-6.1-terra): as the later GPT-5 versions, Chat
        # Completions refuses its function tools unless the effort is explicitly `none` ("…not
        # supported for gpt-6-sol in /v1/chat/completions. To use function tools, use
        # /v1/responses or set reasoning_effort to 'none'.", onyx-dot-app/onyx#15008). Efforts
        # none to max, no `minimal`, and 128,000 output tokens (OpenAI's gpt-6-sol model page:
        # "`reasoning.effort` supports `none`, `low`, `medium` (default), `high`, `xhigh`, and
        # `max`"; gpt-6.1-terra and gpt-6-luna list the same, docs.comfy.org's OpenAI node).
        replace(
            _GPT_5,
            name="gpt-6",
            efforts=GPT_56_EFFORTS,
            off_effort="none",
        ),
        # gpt-6-astra reasons always: `none` and `minimal` are 400s ("Supported values are:
        # 'low', 'medium', 'high', 'xhigh', and 'max'", live probes in UKGovernmentBEIS/inspect_ai
        # #5254 and bolna-ai/bolna#1019), so thinking "off" asks for `low`; 128K output tokens
        # (coder/xum#4064, dcdpr/jp#1086). So do gpt-6.1-sol (OpenAI's deployment checklist:
        # "GPT-6 Astra and GPT-6.1 Sol require Responses for tool calling; GPT-6 Sol and GPT-6
        # Luna support function calling in Chat Completions only with reasoning_effort none";
        # "GPT-6.1 Sol does not accept none or minimal", apidog's guide from its model page),
        # gpt-6.2-astra and gpt-6.2-sol (released 2026-11-17; the GPT-6.2 Sol model page, as
        # w3cschool.cn mirrors it: the API refuses reasoning effort none; "Don't set effort to
        # none: the API rejects it", apidog's GPT-6.2 Astra guide; both "reject reasoning_effort
        # values none and minimal", BerriAI/litellm discussion #52347; 128,000 output tokens).
        # gpt-6-sol, gpt-6-luna and gpt-6.1-terra take `none` and stay on the `gpt-6` row.
        replace(
            _GPT_5,
            name="gpt-6-astra",
            efforts=frozenset({"low", "medium", "high", "xhigh", "max"}),
            off_effort="low",
        ),
        # gpt-5.1-chat-latest and later chat-latest models: reasoning at `medium` only, and
        # 16,384 output tokens (their model pages).
        replace(
            _GPT_5,
            name="gpt-5.x-chat",
            efforts=frozenset({"medium"}),
            off_effort="medium",
            max_output_tokens=16384,
        ),
        _O_SERIES,
        # o3-mini: as the o-series, without image input ("o3-mini does not support vision
        # capabilities", OpenAI's launch post, as appatalks/eva-agent#65 quotes it).
        replace(_O_SERIES, name="openai-o-series-text", vision=False),
        # o1-mini (deprecated): no function tools (404 "tools is not supported in this
        # model", UKGovernmentBEIS/inspect_ai#1290, dzhng/deep-research#96), no images, no
        # reasoning effort: refused at start.
        ModelProfile(
            "o1-mini",
            "openai",
            frozenset(),
            max_output_tokens=65536,
            tools=False,
            vision=False,
        ),
        # o1-pro and o3-pro: as the o-series, served by the Responses API alone (Chat
        # Completions answers them 404 "This model is only supported in v1/responses and not
        # in v1/chat/completions.", simonw/llm#1169, HeyPuter/puter#1303), and never streamed
        # (o1-pro: "Streaming is not supported", its model page as aipromptshub.co quotes it;
        # "Some models, such as gpt-5.5-pro and o3-pro, never stream", docs.auriko.ai).
        # Only the Responses API serves them, which takes `parallel_tool_calls`.
        replace(
            _O_SERIES,
            name="openai-o-series-pro",
            chat_tools=False,
            parallel_tool_calls=True,
            streams=False,
        ),
        ModelProfile("openai-unknown", "openai", frozenset({"adaptive", "budget"}), reasoning=True),
    )
}

#: Model name prefixes → profile: the longest row the model falls under wins, a row matching
#: only at a boundary of the name (`planner/model_names.py`: gpt-5.1 is no row of gpt-5.10).
FAMILIES: dict[str, str] = {
    "claude-sonnet-4-5": "claude-budget",
    "claude-opus-4-5": "claude-opus-4.5",
    "claude-haiku-4-5": "claude-budget",
    "claude-opus-4-1": "claude-opus-4",
    "claude-opus-4-0": "claude-opus-4",
    "claude-sonnet-4-0": "claude-budget",
    "claude-3-7-sonnet": "claude-budget",
    "claude-sonnet-4-6": "claude-4.6",
    "claude-opus-4-6": "claude-4.6",
    "claude-opus-4-7": "claude-adaptive-only",
    "claude-opus-4-8": "claude-adaptive-only",
    "claude-opus-5": "claude-5",
    "claude-sonnet-5": "claude-5",
    "claude-opus-5-5": "claude-opus-5.5",
    "claude-sonnet-5-5": "claude-sonnet-5.5",
    "claude-haiku-5-5": "claude-5",  # thinks unless told `disabled` (at effort high or below)
    "claude-fable": "claude-progress-updates",
    "claude-mythos": "claude-always-thinks",
    "claude-mythos-5-1": "claude-progress-updates",
    "gpt-4.1": "gpt-4.1",
    "gpt-4o": "gpt-4o",
    "o1": "openai-o-series",
    "o3": "openai-o-series",
    "o4": "openai-o-series",
    "o1-pro": "openai-o-series-pro",
    "o1-mini": "o1-mini",
    "o3-mini": "openai-o-series-text",
    "o3-pro": "openai-o-series-pro",
    "gpt-5": "openai-reasoning",
    "gpt-5-pro": "gpt-5-pro",
    "gpt-5-codex": "gpt-5.1-codex",  # reasons always: low, medium, high
    "gpt-5.1": "gpt-5.1",
    "gpt-5.1-codex-max": "gpt-5.1-codex-max",
    "gpt-5.1-codex": "gpt-5.1-codex",
    "gpt-5.1-codex-mini": "gpt-5.1-codex-mini",
    "gpt-5.2-codex": "gpt-5.x-codex",
    "gpt-5.3-codex": "gpt-5.x-codex",
    "gpt-5.2-pro": "gpt-5.x-pro",
    "gpt-5.4-pro": "gpt-5.x-pro",
    "gpt-5.5-pro": "gpt-5.x-pro",
    "gpt-5.": "gpt-5.2+",  # every later GPT-5 version: gpt-5.2, 5.4, 5.5…
    "gpt-5.6": "gpt-5.6",  # gpt-5.6-sol, -terra, -luna
    "gpt-5-chat": "gpt-5-chat",
    "gpt-6": "gpt-6",
    "gpt-6.": "gpt-6",  # its later versions: gpt-6.1-terra…
    "gpt-6-astra": "gpt-6-astra",
    "gpt-6.1-sol": "gpt-6-astra",  # reasons always as gpt-6-astra does: low to max
    "gpt-6.2-astra": "gpt-6-astra",
    "gpt-6.2-sol": "gpt-6-astra",
    "gpt-5.1-chat": "gpt-5.x-chat",
    "gpt-5.2-chat": "gpt-5.x-chat",
    "gpt-5.3-chat": "gpt-5.x-chat",
}


def _by_version(model: str) -> ModelProfile | None:
    """A versioned Claude name the table does not list: the profile of the nearest listed
    version below it in its family (claude-opus-4-9 → 4.8's), or, above every listed version
    of the family (claude-opus-5-7, claude-sonnet-6), `claude-newer` reading answers as the
    family's newest model does (`text_as_thinking`: Opus 5.5 and Sonnet 5.5 return their text
    in thinking blocks, and a later Opus or Sonnet was read as if it never did, its rationale
    taken for thinking). Only that is inherited: what else a request may carry stays
    `claude-newer`'s, so a rule the newer model dropped is refused at start, not by the
    provider at the first step."""
    parsed = claude_version(model)
    if parsed is None:
        return None
    family, version = parsed
    listed = family_rows(family, FAMILIES)
    if not listed:
        return None
    if version in listed:
        return PROFILES[FAMILIES[listed[version]]]
    below = [v for v in listed if v < version]
    if len(below) == len(listed):
        newest = PROFILES[FAMILIES[listed[max(listed)]]]
        return replace(PROFILES["claude-newer"], text_as_thinking=newest.text_as_thinking)
    return PROFILES[FAMILIES[listed[max(below)]]] if below else None


def profile_for(model: str, vendor: Literal["anthropic", "openai"]) -> ModelProfile:
    """The profile of `model`: for a versioned Claude name by its version (exact, the nearest
    listed version below, or `claude-newer` past the table), else by the longest listed row it
    falls under (at a boundary of the name), else the vendor's conservative one."""
    if vendor == "anthropic":
        versioned = _by_version(model)
        if versioned is not None:
            return versioned
    row = longest_row(model, FAMILIES)
    if row is not None:
        profile = PROFILES[FAMILIES[row]]
        if profile.vendor == vendor:
            return profile
    return PROFILES[f"{vendor}-unknown"]


def with_display(profile: ModelProfile, display: ThinkingDisplay) -> ModelProfile:
    """`profile` asking for the display `AMC_PLANNER_THINKING_DISPLAY` chooses, on a model that
    returns its text in thinking blocks (`text_as_thinking`; any other keeps its own).

    Neither display gives both what the model thought and why it acts, exactly: `summarized`
    returns the reasoning summaries (live and in the log) with the text in a block the
    decision places by order, `updates` (beta header) the text alone and no reasoning at all.
    """
    if display == "summarized" or not profile.text_as_thinking:
        return profile
    return replace(
        profile,
        visible_display="updates",
        beta_headers={**profile.beta_headers, "adaptive": THINKING_DISPLAY_UPDATES_BETA},
    )


def resolve(settings: PlannerSettings) -> ModelProfile:
    """The profile in use: `AMC_PLANNER_MODEL_PROFILE` when set, else by the model's name, with
    the display `AMC_PLANNER_THINKING_DISPLAY` chooses (`with_display`)."""
    return with_display(_named_or_looked_up(settings), settings.thinking_display)


def _named_or_looked_up(settings: PlannerSettings) -> ModelProfile:
    vendor = settings.resolved_provider
    if vendor == "offline":
        raise PlannerConfigError("planner: the offline provider has no model profile")
    if settings.model_profile:
        profile = PROFILES.get(settings.model_profile)
        if profile is None or profile.vendor != vendor:
            names = ", ".join(sorted(n for n, p in PROFILES.items() if p.vendor == vendor))
            raise PlannerConfigError(
                f"planner: AMC_PLANNER_MODEL_PROFILE={settings.model_profile!r} is not a "
                f"{vendor} profile (known: {names})"
            )
        return profile
    return profile_for(settings.resolved_model, vendor)


def check(profile: ModelProfile, settings: PlannerSettings) -> None:
    """Refuse, with one line naming the setting to change, a configuration the model cannot
    take. Called when an adapter is made, so it fails at start rather than at the first step."""
    model = settings.resolved_model
    who = f"planner: model {model} (profile {profile.name})"
    if not profile.tools:
        raise PlannerConfigError(
            f"{who} takes no function tools, and the planner acts only through them: choose a "
            "model that calls tools (AMC_PLANNER_MODEL: e.g. gpt-5 or gpt-5.1 for a GPT-5 "
            "model, gpt-4.1 without reasoning)"
        )
    if settings.send_screenshot and not profile.vision:
        raise PlannerConfigError(
            f"{who} takes no image input, so the screenshot cannot be sent: set "
            "AMC_PLANNER_SEND_SCREENSHOT=false (the screen goes as its element list, text "
            "only), or choose a model that takes images (e.g. o4-mini)"
        )
    mode = settings.thinking_mode
    if mode == "off" and profile.thinking_off is None:
        newer = (
            "; it is newer than the model table, and newer Claude models think although told "
            "nothing — if it can run without thinking, name a profile with "
            "AMC_PLANNER_MODEL_PROFILE (e.g. claude-adaptive-only)"
            if profile.name == "claude-newer"
            else ""
        )
        raise PlannerConfigError(
            f"{who} always thinks (thinking cannot be off): set AMC_PLANNER_THINKING=adaptive"
            + newer
        )
    if mode != "off" and not profile.thinking_modes:
        raise PlannerConfigError(
            f"{who} does not reason: set AMC_PLANNER_THINKING=off, or choose a reasoning model"
        )
    if mode != "off" and mode not in profile.thinking_modes:
        takes = " or ".join(sorted(profile.thinking_modes))
        raise PlannerConfigError(
            f"{who} does not take {mode} thinking: set AMC_PLANNER_THINKING={takes}"
        )
    # Anthropic sends the effort with thinking off too (it governs every output token); an
    # OpenAI model with thinking off is asked for its least effort (`off_effort`) instead, so
    # an effort set beside it would be dropped without a word.
    if profile.vendor == "openai" and mode == "off" and settings.effort:
        least = (
            f"asked for its least effort ({profile.off_effort})"
            if profile.reasoning and profile.off_effort
            else "sent no effort"
        )
        raise PlannerConfigError(
            f"{who} is {least} with AMC_PLANNER_THINKING=off, so AMC_PLANNER_EFFORT="
            f"{settings.effort} would not be used: set AMC_PLANNER_THINKING=adaptive, or unset "
            "AMC_PLANNER_EFFORT"
        )
    if settings.effort and settings.effort not in profile.efforts:
        levels = ", ".join(sorted(profile.efforts)) or "no effort level"
        raise PlannerConfigError(
            f"{who} does not take effort {settings.effort!r} (it takes: {levels}): "
            "change AMC_PLANNER_EFFORT"
        )
    off_efforts = profile.off_efforts
    if mode == "off" and off_efforts is not None and settings.effort not in {None, *off_efforts}:
        levels = ", ".join(sorted(off_efforts))
        raise PlannerConfigError(
            f"{who} turns thinking off only at effort {levels}, not {settings.effort!r}: "
            "change AMC_PLANNER_EFFORT or set AMC_PLANNER_THINKING=adaptive"
        )
    limit = profile.max_output_tokens
    if limit is not None and settings.effective_max_tokens > limit:
        raise PlannerConfigError(
            f"{who} writes at most {limit} output tokens; AMC_PLANNER_MAX_TOKENS (with the "
            f"thinking budget) asks for {settings.effective_max_tokens}"
        )
