"""The price table: list prices per model family, an operator's file over them, and a model call
priced once as it returns (the decision's usage sums the calls)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from planner.decision import Usage
from planner.model_profiles import FAMILIES
from planner.planner import Planner
from planner.prices import (
    DEFAULT_PRICES,
    PRICED_AS_THEIR_VERSION,
    Price,
    PricesFileError,
    PriceTable,
)
from planner.providers import make_provider
from planner.settings import DEFAULT_MODELS, PlannerSettings
from planner.vendors import make_adapter
from planner.vendors.base import TurnRequest
from planner.vendors.observed import ObservedAdapter
from tests.planner.scenes import settings_main
from tests.support.fakes import OPENAI_KEY, FakeModelServer, ScriptedTurn, function_call

INTENT = {"purpose": "leave this screen", "expected_outcome": "the screen before it"}


def test_every_model_family_the_planner_knows_and_each_default_model_has_a_price() -> None:
    table = PriceTable()
    # The o4 family has one model; GPT-6's models are priced one by one.
    examples = {"o4": "o4-mini", "gpt-6": "gpt-6-sol", "gpt-5.": "gpt-5.2", "gpt-6.": "gpt-6.1-sol"}
    for prefix in [*FAMILIES, *DEFAULT_MODELS.values()]:
        assert table.price(examples.get(prefix, prefix)) is not None, prefix
    # A dated model name finds its family's row; the longest prefix wins.
    assert table.price("claude-sonnet-4-6-20260301") == DEFAULT_PRICES["claude-sonnet-4"]
    assert table.price("gpt-4.1-mini-2025-04-14") == DEFAULT_PRICES["gpt-4.1-mini"]
    assert table.price("claude-sonnet-5-5") != table.price("claude-sonnet-5")
    assert table.price("llama-3") is None
    # Later GPT-5 versions are not GPT-5's price (gpt-5.5 costs four times gpt-5's input).
    assert table.price("gpt-5.5-2026-04-23") == Price(5.0, 30.0, 0.50)
    assert table.price("gpt-5.4-pro") == Price(30.0, 180.0)
    assert table.price("gpt-5.6-sol") == table.price("gpt-5.6")
    assert table.price("gpt-6-astra") != table.price("gpt-6-sol")
    # GPT-6.2 (2026-11-17): Astra cheaper than GPT-6 Astra, Sol at GPT-6.1 Sol's rates.
    assert table.price("gpt-6.2-astra") == Price(8.0, 40.0, 0.40, 10.0)
    assert table.price("gpt-6.2-sol") == Price(2.0, 10.0, 0.10, 2.5)
    assert table.price("gpt-6.3-sol") is None  # not listed: unpriced, not guessed


@pytest.mark.parametrize(
    ("model", "row"),
    [
        # A row matches at the end of the id or before a `-` (a size, a variant, a date) ...
        ("gpt-5.1", "gpt-5.1"),
        ("gpt-5.1-2025-11-13", "gpt-5.1"),
        ("gpt-5-2025-08-07", "gpt-5"),
        ("o3-pro-2025-06-10", "o3-pro"),
        ("claude-opus-4-1-20250805", "claude-opus-4-1"),
        ("claude-opus-4-20250514", "claude-opus-4-20250514"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        # ... and nowhere else: a model that only starts with a row's characters is not
        # billed as that row's model (gpt-5.10 is no gpt-5.1, claude-opus-4-10 no Opus 4.1).
        ("gpt-5.10", None),
        ("gpt-50", None),
        ("gpt-4.10", None),
        ("gpt-4o1", None),
        ("o30", None),
        ("claude-opus-4-10", None),
        ("claude-opus-4-29", None),
        ("claude-haiku-4-50", None),
        ("claude-fabled", None),
    ],
)
def test_a_model_id_is_priced_by_a_row_only_at_a_boundary(model: str, row: str | None) -> None:
    table = PriceTable()
    assert table.price(model) == (DEFAULT_PRICES[row] if row is not None else None)


def test_an_operator_row_matches_only_at_a_boundary_too(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text('[models."acme-7"]\ninput = 1.0\noutput = 2.0\n')
    table = PriceTable.load(path)
    assert table.price("acme-7-20260101") == Price(1.0, 2.0)
    assert table.price("acme-70") is None


def test_a_call_costs_each_kind_of_token_at_its_rate() -> None:
    usage = Usage(
        input_tokens=1_000_000,
        output_tokens=100_000,
        cache_read_input_tokens=2_000_000,
        cache_creation_input_tokens=400_000,
        thinking_tokens=50_000,  # part of output: not billed twice
    )
    assert Price(3.0, 15.0, 0.3, 3.75).cost(usage) == pytest.approx(3 + 1.5 + 0.6 + 1.5)
    table = PriceTable()
    assert table.cost("claude-sonnet-4-6", usage) == pytest.approx(6.6)
    assert table.cost("unknown-model", usage) == 0.0
    assert "no price known for unknown-model" in table.describe("unknown-model")


def test_one_hour_cache_writes_cost_their_own_rate_also_in_an_operator_row(
    tmp_path: Path,
) -> None:
    """Claude bills a 1-hour cache write at 2x input, a 5-minute one at 1.25x (the pricing
    page's prompt caching table); a row without the 1-hour rate prices them at `cache_write`."""
    usage = Usage(cache_creation_input_tokens=3_000_000, cache_creation_1h_input_tokens=1_000_000)
    assert PriceTable().cost("claude-sonnet-4-6", usage) == pytest.approx(2 * 3.75 + 6.0)
    path = tmp_path / "prices.toml"
    path.write_text('[models."acme-7"]\ninput = 1.0\noutput = 2.0\ncache_write = 1.25\n'
                    '[models."acme-8"]\ninput = 1.0\noutput = 2.0\ncache_write = 1.25\n'
                    "cache_write_1h = 2.0\n")  # fmt: skip
    table = PriceTable.load(path)
    assert table.cost("acme-7", usage) == pytest.approx(3 * 1.25)
    assert table.cost("acme-8", usage) == pytest.approx(2 * 1.25 + 2.0)
    assert "$1.25 cache write ($2 for 1 hour)" in table.describe("acme-8")


def test_an_operator_claude_row_without_the_one_hour_rate_prices_it_at_twice_input(
    tmp_path: Path,
) -> None:
    """A Claude row copied into the prices file without the optional `cache_write_1h` line
    replaced the default row and billed 1-hour writes at the 5-minute rate (1.25x input):
    Anthropic bills them at 2x input for every model, so that is the row's default."""
    path = tmp_path / "prices.toml"
    path.write_text('[models."claude-sonnet-4-6"]\ninput = 3.0\noutput = 15.0\n'
                    "cache_read = 0.3\ncache_write = 3.75\n")  # fmt: skip
    usage = Usage(cache_creation_input_tokens=1_000_000, cache_creation_1h_input_tokens=1_000_000)
    assert PriceTable.load(path).cost("claude-sonnet-4-6", usage) == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (
            "prices.toml",
            '[models."claude-sonnet-4-6"]\ninput = 2.0\noutput = 10.0\ncache_read = 0.2\n',
        ),
        (
            "prices.json",
            '{"models": {"claude-sonnet-4-6": {"input": 2.0, "output": 10.0, "cache_read": 0.2}}}',
        ),
    ],
)
def test_an_operator_file_overrides_a_row_and_adds_models(
    tmp_path: Path, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    table = PriceTable.load(path)
    assert table.price("claude-sonnet-4-6-20260301") == Price(2.0, 10.0, 0.2, 0.0, 4.0)
    assert table.price("claude-sonnet-4-5") == DEFAULT_PRICES["claude-sonnet-4"]  # untouched
    assert str(path) in table.describe("claude-sonnet-4-6")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("models = 3", 'has no "models" table'),
        ('[models."m"]\ninput = 1.0\n', "models.m needs input and output"),
        ('[models."m"]\ninput = 1.0\noutput = -2\n', "prices must be numbers >= 0"),
        ('[models."m"]\ninput = 1.0\noutput = "x"\n', "prices must be numbers >= 0"),
        ('[models."m"]\ninput = 1.0\noutput = 2\nbatch = 1\n', "unknown fields ['batch']"),
        ("[models", "is not valid TOML"),
    ],
)
def test_a_bad_price_file_is_one_line_naming_the_setting(
    tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(text)
    with pytest.raises(PricesFileError) as caught:
        PriceTable.load(path)
    assert str(caught.value).startswith("AMC_PLANNER_PRICES_FILE: ")
    assert words in str(caught.value)
    with pytest.raises(PricesFileError, match="cannot read"):
        PriceTable.load(tmp_path / "missing.toml")


async def test_each_model_call_is_priced_as_it_returns(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text('[models."amc-offline"]\ninput = 1000.0\noutput = 2000.0\n')
    adapter = make_provider(PlannerSettings(provider="offline", prices_file=path))
    assert isinstance(adapter, ObservedAdapter)
    heard: list[tuple[str, str, Usage | None]] = []

    class Observer:
        def call_finished(
            self,
            provider: str,
            model: str,
            seconds: float,
            usage: Usage | None,
            error: BaseException | None,
        ) -> None:
            heard.append((provider, model, usage))

    adapter.observer = Observer()
    from planner.conversation.items import UserObservation
    from planner.prompts import SYSTEM_PROMPT
    from planner.tools import TOOLS

    turn = await adapter.complete(
        TurnRequest(
            system=SYSTEM_PROMPT,
            items=[UserObservation("Goal: Turn on dark theme\nScreen: launcher")],
            tools=TOOLS,
        )
    )
    u = turn.usage
    assert u.cost_usd == pytest.approx((u.input_tokens * 1000 + u.output_tokens * 2000) / 1e6)
    assert u.cost_usd > 0
    assert heard == [("offline", turn.model, u)]


#: The model families of the profile table priced on purpose by a shorter row: the same list
#: price as the model the row names (Claude Sonnet 4, 4.5 and 4.6; a chat or Codex model at
#: its GPT-5 version's rates). Any other family falling to a shorter row is a sibling the price
#: table lacks: o1-pro was billed as o1, at a tenth of its price.


@pytest.mark.parametrize(
    "model", ["claude-sonnet-4-6", "claude-sonnet-4-5-20250929", "gpt-5.1-codex", "gpt-5.2-chat"]
)
def test_a_model_priced_by_its_version_on_purpose_is_not_said_to_borrow(
    model: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning for a borrowed row fired on the default model (claude-sonnet-4-6 under
    claude-sonnet-4) at every start: the aliases the table means lived only in this test."""
    table = PriceTable()
    with caplog.at_level(logging.WARNING, logger="planner.prices"):
        assert table.price(model) is not None
    assert not table.borrowed(model)
    assert "no price row" not in caplog.text
    assert ", by the" not in table.describe(model)


def test_every_model_family_has_a_price_row_of_its_own_unless_listed() -> None:
    table = PriceTable()
    for family in FAMILIES:
        if family[-1] in ".-" or family in {"gpt-6", "o4"}:  # series; priced model by model
            continue
        want = PRICED_AS_THEIR_VERSION.get(family, family)
        assert table.row(family) == want, family
    assert table.price("o1-pro") == table.price("o1-pro-2025-03-19") == Price(150.0, 600.0)
    assert table.price("gpt-5.1-codex-mini") == Price(0.25, 2.0, 0.025)
    assert table.price("gpt-4o-2024-05-13") == Price(5.0, 15.0)
    assert table.price("gpt-4o-2024-11-20") == DEFAULT_PRICES["gpt-4o"]
    assert table.price("o3-deep-research-2025-06-26") == Price(10.0, 40.0, 2.50)
    assert table.price("o4-mini-deep-research") == Price(2.0, 8.0, 0.50)


async def test_o1_pro_calls_are_billed_at_o1_pro_rates(fake_server: FakeModelServer) -> None:
    """o1-pro fell under o1's row: a call of 100,000 input and 20,000 output tokens was
    billed $2.70 instead of $27, and every cost cap let ten times its budget through."""
    usage = {"input_tokens": 100_000, "output_tokens": 20_000}
    for model in ("o1-pro", "o1-pro-2025-03-19"):
        fake_server.script_responses(
            ScriptedTurn([function_call("press_key", {"key": "back", **INTENT})], usage=usage)
        )
        settings = PlannerSettings(
            provider="openai",
            openai_api_key=OPENAI_KEY,
            openai_base_url=fake_server.openai_base_url,
            model=model,
            max_retries=0,
        )
        planner = Planner(make_adapter(settings), settings)
        try:
            decision = await planner.decide("Go back", settings_main())
        finally:
            await planner.aclose()
        assert fake_server.requests[-1].path == "/v1/responses"
        assert decision.usage.cost_usd == pytest.approx(27.0)


def test_a_model_priced_by_another_models_row_is_logged_once_and_named_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A model without a row of its own took the longest row it fell under without a word
    (a made-up sibling here: the table lists every real one it knows)."""
    table = PriceTable()
    with caplog.at_level(logging.WARNING, logger="planner.prices"):
        for _ in range(3):
            assert table.price("gpt-5.1-codex-nano") == DEFAULT_PRICES["gpt-5.1"]
            assert table.price("gpt-4.1-mini-2025-04-14") == DEFAULT_PRICES["gpt-4.1-mini"]
            assert table.price("claude-opus-4-1-20250805") == DEFAULT_PRICES["claude-opus-4-1"]
    (record,) = caplog.records
    assert "no price row for gpt-5.1-codex-nano" in record.getMessage()
    assert "'gpt-5.1' row" in record.getMessage()
    assert "AMC_PLANNER_PRICES_FILE" in record.getMessage()
    assert "by the 'gpt-5.1' row" in table.describe("gpt-5.1-codex-nano")
    assert "row" not in table.describe("gpt-4.1-mini-2025-04-14")
