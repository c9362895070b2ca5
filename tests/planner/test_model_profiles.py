"""Model profiles: the table, the conservative profile for unknown models, the operator's
override, and configurations refused at start with one line."""

from __future__ import annotations

from typing import Any

import pytest

from planner.errors import PlannerConfigError
from planner.model_profiles import PROFILES, check, profile_for, resolve
from planner.settings import PlannerSettings
from planner.vendors import make_adapter


def settings(**values: Any) -> PlannerSettings:
    base: dict[str, Any] = {"provider": "anthropic", "anthropic_api_key": "sk-ant-x"}
    if values.get("provider") == "openai":
        base = {"openai_api_key": "sk-x"}
    return PlannerSettings(**{**base, **values})


@pytest.mark.parametrize(
    ("model", "vendor", "profile"),
    [
        ("claude-sonnet-4-5", "anthropic", "claude-budget"),
        ("claude-opus-4-5-20251101", "anthropic", "claude-opus-4.5"),
        ("claude-sonnet-4-6", "anthropic", "claude-4.6"),
        ("claude-opus-4-6", "anthropic", "claude-4.6"),
        ("claude-opus-4-7", "anthropic", "claude-adaptive-only"),
        ("claude-opus-4-8", "anthropic", "claude-adaptive-only"),
        ("claude-opus-5", "anthropic", "claude-5"),
        ("claude-sonnet-5", "anthropic", "claude-5"),
        ("claude-opus-5-5", "anthropic", "claude-opus-5.5"),
        ("claude-sonnet-5-5", "anthropic", "claude-sonnet-5.5"),
        ("claude-haiku-5-5", "anthropic", "claude-5"),
        ("claude-fable-5-1", "anthropic", "claude-progress-updates"),
        ("claude-mythos-5-1", "anthropic", "claude-progress-updates"),
        ("claude-mythos-5", "anthropic", "claude-always-thinks"),
        ("claude-mythos-preview", "anthropic", "claude-always-thinks"),
        # Forward-compatible: a version between listed ones takes the one below it, a version
        # past the table the profile of the newest documented behaviour (never the unknown).
        ("claude-opus-4-9", "anthropic", "claude-adaptive-only"),
        ("claude-opus-5-7", "anthropic", "claude-newer"),
        ("claude-haiku-6", "anthropic", "claude-newer"),
        ("claude-sonnet-6", "anthropic", "claude-newer"),
        # Date suffixes are no versions.
        ("claude-sonnet-4-20250514", "anthropic", "claude-budget"),
        ("claude-haiku-4-5-20251001", "anthropic", "claude-budget"),
        ("claude-test-model", "anthropic", "anthropic-unknown"),
        ("gpt-4.1-mini", "openai", "gpt-4.1"),
        ("gpt-4o", "openai", "gpt-4o"),
        ("o4-mini", "openai", "openai-o-series"),
        ("o3", "openai", "openai-o-series"),
        ("o3-mini-2025-01-31", "openai", "openai-o-series-text"),  # no image input
        ("o1-mini", "openai", "o1-mini"),  # no function tools
        ("gpt-5-mini", "openai", "openai-reasoning"),
        ("gpt-5-chat-latest", "openai", "gpt-5-chat"),
        ("gpt-5-pro-2025-10-06", "openai", "gpt-5-pro"),
        ("gpt-5.1", "openai", "gpt-5.1"),
        ("gpt-5.1-2025-11-13", "openai", "gpt-5.1"),
        ("gpt-5.1-codex-max", "openai", "gpt-5.1-codex-max"),
        ("gpt-5.2", "openai", "gpt-5.2+"),
        ("gpt-5.4-mini", "openai", "gpt-5.2+"),
        ("gpt-5.6-sol", "openai", "gpt-5.6"),
        ("gpt-6-sol", "openai", "gpt-6"),
        ("gpt-6-astra", "openai", "gpt-6-astra"),
        ("gpt-6.2-astra", "openai", "gpt-6-astra"),  # low to max, as gpt-6-astra
        ("gpt-6.2-sol", "openai", "gpt-6-astra"),
        ("gpt-6.1-sol", "openai", "gpt-6-astra"),
        ("gpt-6.1-terra", "openai", "gpt-6"),  # takes none
        ("gpt-6-luna", "openai", "gpt-6"),
        ("gpt-5.1-chat-latest", "openai", "gpt-5.x-chat"),
        ("gpt-5.3-chat-latest", "openai", "gpt-5.x-chat"),
        ("gpt-test-model", "openai", "openai-unknown"),
        # A name of the other vendor's family is no profile of this one.
        ("gpt-4.1", "anthropic", "anthropic-unknown"),
    ],
)
def test_models_map_to_their_family(model: str, vendor: Any, profile: str) -> None:
    assert profile_for(model, vendor).name == profile


@pytest.mark.parametrize(
    ("model", "vendor", "profile"),
    [
        # A row matches at the end of the id or before a `-` (a size, a variant, a date) ...
        ("gpt-5.1", "openai", "gpt-5.1"),
        ("gpt-5.1-2025-11-13", "openai", "gpt-5.1"),
        ("o3-2025-04-16", "openai", "openai-o-series"),
        ("gpt-4o-2024-08-06", "openai", "gpt-4o"),
        # ... and nowhere else: another version that only starts with the same characters
        # is not that row's model (gpt-5.10 is a later GPT-5, not gpt-5.1).
        ("gpt-5.10", "openai", "gpt-5.2+"),
        ("gpt-5.10-chat-latest", "openai", "gpt-5.2+"),
        ("gpt-50", "openai", "openai-unknown"),
        ("gpt-4.10", "openai", "openai-unknown"),
        ("gpt-4o1", "openai", "openai-unknown"),
        ("o30", "openai", "openai-unknown"),
        ("gpt-60", "openai", "openai-unknown"),
        ("claude-fabled", "anthropic", "anthropic-unknown"),
        ("claude-mythos2", "anthropic", "anthropic-unknown"),
        # A Claude version is read as a version: 4-10 is after 4-8, not 4-1.
        ("claude-opus-4-10", "anthropic", "claude-adaptive-only"),
        ("claude-opus-4-1-20250805", "anthropic", "claude-opus-4"),
    ],
)
def test_a_model_id_matches_a_row_only_at_a_boundary(model: str, vendor: Any, profile: str) -> None:
    assert profile_for(model, vendor).name == profile


@pytest.mark.parametrize(
    ("model", "reads_text_in_thinking"),
    [("claude-opus-5-7", True), ("claude-sonnet-6", True), ("claude-haiku-6", False)],
)
def test_a_newer_claude_reads_answers_as_its_familys_newest(
    model: str, reads_text_in_thinking: bool
) -> None:
    """Opus 5.5 and Sonnet 5.5 return their text in thinking blocks, Haiku 5.5 does not; what a
    newer version's request may carry stays `claude-newer`'s, its display the family's."""
    profile = profile_for(model, "anthropic")
    assert profile.name == "claude-newer" and profile.thinking_off is None
    assert profile.text_as_thinking is reads_text_in_thinking
    assert resolve(settings(model=model)).visible_display == "summarized"
    updates = resolve(settings(model=model, thinking_display="updates"))
    assert updates.visible_display == ("updates" if reads_text_in_thinking else "summarized")


def test_what_the_families_take() -> None:
    budget, adaptive_only = PROFILES["claude-budget"], PROFILES["claude-adaptive-only"]
    assert budget.thinking_modes == {"budget"} and budget.retry_form(thinking=True) == "forced"
    assert adaptive_only.thinking_modes == {"adaptive"}
    assert adaptive_only.visible_display == "summarized"
    assert adaptive_only.retry_form(thinking=True) == "nudge"
    assert PROFILES["claude-4.6"].thinking_off == "disabled"
    assert PROFILES["claude-always-thinks"].thinking_off is None
    assert not PROFILES["gpt-4.1"].reasoning and PROFILES["openai-reasoning"].reasoning
    unknown = PROFILES["anthropic-unknown"]
    # Conservative: what the settings ask for, nothing added, nothing refused.
    assert unknown.visible_display is None and unknown.thinking_off == "omit"
    assert unknown.thinking_modes == {"adaptive", "budget"} and unknown.max_output_tokens is None


@pytest.mark.parametrize(
    ("model", "limit"),
    [
        # Each model's page on platform.claude.com ("Max output"), for the models still served
        # in late 2026 (Claude 3.5 Haiku, Haiku 3, 3.7 Sonnet, Sonnet 4, Opus 4 and 4.1 are
        # retired).
        ("claude-haiku-4-5", 64000),
        ("claude-sonnet-4-5", 64000),
        ("claude-sonnet-4-6", 128000),
        ("claude-opus-4-6", 128000),
        ("claude-opus-5", 128000),
        ("claude-sonnet-5", 128000),
        ("claude-haiku-5-5", 128000),
        ("claude-opus-5-5", 128000),
        ("claude-sonnet-5-5", 128000),
        ("claude-fable-5-1", 128000),
        # Retired, still in the table: Opus 4 and 4.1 write 32K.
        ("claude-opus-4-1-20250805", 32000),
        ("claude-opus-4-20250514", 32000),
        ("claude-sonnet-4-20250514", 64000),
    ],
)
def test_each_claude_model_has_its_documented_output_limit(model: str, limit: int) -> None:
    """Sonnet 4.6 and Opus 4.6 were held to 64K, where both write 128K (the limit bounds the
    output room raised after a cut-off answer, and what is refused at start)."""
    assert profile_for(model, "anthropic").max_output_tokens == limit


@pytest.mark.parametrize(
    ("model", "limit"),
    [
        ("o3", 100000),
        ("o4-mini", 100000),
        ("gpt-5", 128000),
        ("gpt-5-mini", 128000),
        ("gpt-5.1", 128000),
        ("gpt-5.1-codex-max", 128000),
        ("gpt-5.2-codex", 128000),
        ("gpt-5.4", 128000),
        ("gpt-5.5-pro", 128000),
        ("gpt-5.6-sol", 128000),
        ("gpt-5-pro", 272000),
        ("gpt-5.2-chat-latest", 16384),
    ],
)
def test_each_openai_reasoning_model_has_its_documented_output_limit(
    model: str, limit: int
) -> None:
    """Every GPT-5 was held to the o-series' 100,000 output tokens, where the GPT-5 family
    writes 128,000 and gpt-5-pro 272,000 (their model pages). No request reaches either
    today (MAX_CALL_TOKENS), but the limit bounds a raised output room and the cost bound of a
    call, so it must be the model's own."""
    assert profile_for(model, "openai").max_output_tokens == limit


def test_an_operator_names_the_profile_of_a_model_the_table_does_not_know() -> None:
    chosen = settings(model="claude-next-preview", model_profile="claude-adaptive-only")
    assert resolve(chosen).name == "claude-adaptive-only"
    with pytest.raises(PlannerConfigError, match=r"not a anthropic profile.*claude-budget"):
        resolve(settings(model_profile="gpt-4.1"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"model": "claude-opus-4-7", "thinking": "budget", "thinking_budget_tokens": 2048},
            "does not take budget thinking: set AMC_PLANNER_THINKING=adaptive",
        ),
        (
            {"model": "claude-sonnet-4-5", "thinking": "adaptive"},
            "does not take adaptive thinking: set AMC_PLANNER_THINKING=budget",
        ),
        ({"model": "claude-mythos-5"}, "always thinks .*: set AMC_PLANNER_THINKING=adaptive"),
        ({"model": "claude-opus-5-5"}, "always thinks .*: set AMC_PLANNER_THINKING=adaptive"),
        ({"model": "claude-opus-5-7"}, "newer than the model table.*AMC_PLANNER_MODEL_PROFILE"),
        ({"model": "claude-opus-5"}, None),  # thinking off is said: `disabled`
        (
            {"model": "claude-sonnet-4-6", "thinking": "adaptive", "effort": "xhigh"},
            "does not take effort 'xhigh'",
        ),
        (
            {"model": "claude-sonnet-4-5", "max_tokens": 20000, "thinking_budget_tokens": 20000},
            None,
        ),
        # Budget thinking with an effort: the API applies both, on the models that take effort
        # (Sonnet 4.5 answers any effort "This model does not support the effort parameter.",
        # Opus 4.5 takes low to high, `max` only from 4.6).
        (
            {"model": "claude-sonnet-4-5", "thinking_budget_tokens": 2048, "effort": "low"},
            "does not take effort 'low' \\(it takes: no effort level\\)",
        ),
        (
            {"model": "claude-opus-4-5", "thinking_budget_tokens": 2048, "effort": "max"},
            "does not take effort 'max'",
        ),
        ({"model": "claude-opus-4-5", "thinking_budget_tokens": 2048, "effort": "low"}, None),
        # Thinking off with an effort: sent alone (effort needs no thinking), so refused where
        # the model takes no effort, or not that one.
        (
            {"model": "claude-sonnet-4-5", "effort": "low"},
            "does not take effort 'low' \\(it takes: no effort level\\)",
        ),
        ({"model": "claude-sonnet-4-6", "effort": "xhigh"}, "does not take effort 'xhigh'"),
        ({"model": "claude-sonnet-4-6", "effort": "low"}, None),
        ({"model": "claude-opus-5", "effort": "max"}, "turns thinking off only at effort"),
        ({"model": "claude-opus-5", "effort": "high"}, None),
        # Sonnet 5.5's `between_tools` is refused at xhigh and max.
        ({"model": "claude-sonnet-5-5", "effort": "xhigh"}, "turns thinking off only at effort"),
        ({"model": "claude-sonnet-5-5", "effort": "high"}, None),
        # OpenAI with thinking off asks for the least effort: an effort set too was dropped.
        (
            {"provider": "openai", "model": "gpt-6.2-sol", "effort": "high"},
            "least effort \\(low\\) with AMC_PLANNER_THINKING=off, so AMC_PLANNER_EFFORT=high "
            "would not be used",
        ),
        (
            {"provider": "openai", "model": "gpt-4.1-mini", "effort": "low"},
            "sent no effort with AMC_PLANNER_THINKING=off",
        ),
        (
            {
                "provider": "openai",
                "model": "gpt-6.2-sol",
                "thinking": "adaptive",
                "effort": "high",
            },
            None,
        ),
        (
            {"provider": "openai", "model": "gpt-4.1-mini", "thinking": "adaptive"},
            "gpt-4.1-mini \\(profile gpt-4.1\\) does not reason: set AMC_PLANNER_THINKING=off",
        ),
        # A model without function tools cannot plan at all: every step was a 400 "tools is not
        # supported in this model" (gpt-5-chat-latest, o1-mini).
        (
            {"provider": "openai", "model": "gpt-5-chat-latest"},
            "gpt-5-chat-latest \\(profile gpt-5-chat\\) takes no function tools.*AMC_PLANNER_MODEL",
        ),
        (
            {"provider": "openai", "model": "gpt-5-chat-latest", "thinking": "adaptive"},
            "takes no function tools",
        ),
        ({"provider": "openai", "model": "o1-mini-2024-09-12"}, "takes no function tools"),
        # A screenshot to a model without image input: every compact step was refused.
        (
            {"provider": "openai", "model": "o3-mini", "send_screenshot": True},
            "o3-mini \\(profile openai-o-series-text\\) takes no image input.*"
            "AMC_PLANNER_SEND_SCREENSHOT=false",
        ),
        ({"provider": "openai", "model": "o3-mini"}, None),
        ({"provider": "openai", "model": "o4-mini", "send_screenshot": True}, None),
    ],
)
def test_a_configuration_the_model_cannot_take_is_refused_at_start(
    values: dict[str, Any], message: str | None
) -> None:
    chosen = settings(**values)
    if message is None:  # within the model's limits: accepted
        check(resolve(chosen), chosen)
        return
    with pytest.raises(PlannerConfigError, match=message) as info:
        make_adapter(chosen)
    assert "\n" not in str(info.value)  # one line


@pytest.mark.parametrize(
    ("model", "effort", "takes"),
    [
        ("gpt-5", "minimal", True),
        ("gpt-5-mini", "none", False),  # before gpt-5.1: no `none`
        ("gpt-5", "xhigh", False),
        ("gpt-5.1", "none", True),  # gpt-5.1's default
        ("gpt-5.1", "minimal", False),
        ("gpt-5.1", "xhigh", False),
        ("gpt-5.2", "xhigh", True),
        ("gpt-5.4", "none", True),
        ("gpt-5.6-sol", "minimal", False),
        ("gpt-5.6-terra", "max", True),  # the GPT-5.6 family: none to max
        ("gpt-5.6", "none", True),
        ("gpt-5.5", "max", False),  # before it: xhigh at most
        ("gpt-6-astra", "none", False),  # reasons always: low to max
        ("gpt-6-astra", "max", True),
        ("gpt-6.2-sol", "none", False),  # as gpt-6-astra: low to max
        ("gpt-6.1-sol", "max", True),
        ("gpt-6-sol", "minimal", False),  # the rest of GPT-6: none to max, as GPT-5.6
        ("gpt-6-luna", "none", True),
        ("gpt-6.1-terra", "max", True),
        ("gpt-5.1-chat-latest", "medium", True),
        ("gpt-5.2-chat-latest", "high", False),  # chat-latest: `medium` only
        ("gpt-5.3-chat-latest", "none", False),
        ("o4-mini", "minimal", False),  # the o-series: low, medium, high
        ("o3", "minimal", False),
        ("o4-mini", "low", True),
        ("gpt-5.1-codex", "none", False),  # the Codex models reason always
        ("gpt-5.1-codex", "high", True),
        ("gpt-5.1-codex-mini", "low", False),  # medium and high only
        ("gpt-5.2-codex", "none", False),
        ("gpt-5.3-codex", "xhigh", True),
        ("gpt-5.4-pro", "low", False),  # the Pro models: medium to xhigh
        ("gpt-5.2-pro", "none", False),
        ("gpt-5.2-pro", "medium", True),
        ("gpt-5.5-pro", "none", False),
        ("gpt-5.5-pro", "xhigh", True),
    ],
)
def test_each_gpt_5_family_takes_its_own_efforts(model: str, effort: str, takes: bool) -> None:
    """The table had one set for every GPT-5: `xhigh` refused for gpt-5.2 and later, `none`
    not configurable at all, `minimal` let through to gpt-5.1 and later, which refuse it, and
    any effort to the chat-latest models, which take only `medium`."""
    chosen = settings(provider="openai", model=model, thinking="adaptive", effort=effort)
    if takes:
        check(resolve(chosen), chosen)
        return
    with pytest.raises(PlannerConfigError, match=f"does not take effort '{effort}'") as info:
        make_adapter(chosen)
    assert "change AMC_PLANNER_EFFORT" in str(info.value)


def test_output_limit_is_checked_against_the_profile() -> None:
    chosen = settings(model="gpt-4o", provider="openai", max_tokens=20000)
    with pytest.raises(PlannerConfigError, match="writes at most 16384 output tokens"):
        make_adapter(chosen)


def test_thinking_off_is_the_least_effort_each_reasoning_model_takes() -> None:
    """A reasoning model told nothing reasons at its default effort; thinking "off" names the
    least effort it takes instead, so every row's `off_effort` must be one it takes (a 400
    on every step otherwise) and the lowest of them. Only the table's unknown row leaves it
    out: its efforts are a guess."""
    order = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
    reasoning = [p for p in PROFILES.values() if p.vendor == "openai" and p.reasoning]
    assert reasoning
    for profile in reasoning:
        if profile.name == "openai-unknown":
            assert profile.off_effort is None
            continue
        least = min(profile.efforts, key=order.index)
        assert profile.off_effort == least, profile.name
