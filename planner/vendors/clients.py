"""The official SDK clients, built one way from the planner settings for every planning mode.

A missing key is refused here, with the setting to fix, rather than by the SDK at the first call,
and so is a key no HTTP header can carry (see `_key`). A key used is kept for
`telemetry.redaction.scrub`: no log line or planner error may quote it, whatever its shape.
"""

from __future__ import annotations

import anthropic
import openai
from pydantic import SecretStr

from planner.errors import PlannerAuthError, PlannerConfigError
from planner.settings import PlannerSettings
from telemetry.redaction import keep_secret


def _key(secret: SecretStr | None, vendor: str, setting: str) -> str:
    """The key, refused here when it is missing or holds a space, a line break or a control
    character (a key file's trailing newline): sent as it is, the HTTP library refuses the
    header before any request, which read as the provider being unreachable, and its error
    quotes the header, key and all, into every traceback that carries it."""
    key = secret.get_secret_value() if secret else ""
    if not key:
        raise PlannerAuthError(f"planner: no {vendor} API key configured (set {setting})")
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise PlannerConfigError(
            f"{setting}: the key holds a space, a line break or another character no API key "
            "has (a key file's trailing newline?); set the key alone"
        )
    keep_secret(key)
    return key


def anthropic_client(settings: PlannerSettings) -> anthropic.AsyncAnthropic:
    key = _key(settings.anthropic_api_key, "Anthropic", "AMC_PLANNER_ANTHROPIC_API_KEY")
    return anthropic.AsyncAnthropic(
        api_key=key,
        base_url=settings.anthropic_base_url,
        max_retries=settings.max_retries,
        timeout=settings.timeout_s,
    )


def openai_client(settings: PlannerSettings) -> openai.AsyncOpenAI:
    key = _key(settings.openai_api_key, "OpenAI", "AMC_PLANNER_OPENAI_API_KEY")
    return openai.AsyncOpenAI(
        api_key=key,
        base_url=settings.openai_base_url,
        max_retries=settings.max_retries,
        timeout=settings.timeout_s,
    )
