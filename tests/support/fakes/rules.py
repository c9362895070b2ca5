"""What each model accepts, as the providers document it: the one rules table of the fakes.

Every fake wire format looks a request's model up here (exact name, else the longest prefix
listed), so a rule about a model family is written once. A model the table does not know gets
`LENIENT`: the rules every model shares and nothing model-specific, so tests with made-up model
names exercise the protocol without guessing at a family.
"""

from __future__ import annotations

from dataclasses import dataclass

ALL_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})


@dataclass(frozen=True, slots=True)
class ModelRules:
    """One model family's request rules.

    - `thinking_types`: the `thinking.type` values it accepts (`enabled` = budget form).
    - `efforts`: accepted `output_config.effort` levels.
    - `reasoning`: OpenAI: accepts `reasoning` (Responses) / `reasoning_effort` (Chat).
    """

    thinking_types: frozenset[str] = frozenset({"enabled", "adaptive", "disabled"})
    efforts: frozenset[str] = ALL_EFFORTS
    reasoning: bool = True


LENIENT = ModelRules()

MODELS: dict[str, ModelRules] = {
    # Claude Opus 4.7 and later, Mythos, Fable: adaptive thinking only.
    "claude-opus-4-7": ModelRules(thinking_types=frozenset({"adaptive", "disabled"})),
}


def rules_for(model: str) -> ModelRules:
    """The rules of `model`: its exact entry, else its longest listed prefix, else LENIENT."""
    if model in MODELS:
        return MODELS[model]
    prefixes = [name for name in MODELS if model.startswith(name)]
    return MODELS[max(prefixes, key=len)] if prefixes else LENIENT
