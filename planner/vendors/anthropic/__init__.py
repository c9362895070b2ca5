"""Anthropic Messages: request building, projection of items, reply parsing, the adapter."""

from planner.model_profiles import INTERLEAVED_THINKING_BETA
from planner.vendors.anthropic.adapter import AnthropicAdapter

__all__ = ["INTERLEAVED_THINKING_BETA", "AnthropicAdapter"]
