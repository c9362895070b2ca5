"""Anthropic Messages: request building, projection of items, reply parsing, the adapter."""

from planner.vendors.anthropic.adapter import AnthropicAdapter
from planner.vendors.anthropic.messages import INTERLEAVED_THINKING_BETA

__all__ = ["INTERLEAVED_THINKING_BETA", "AnthropicAdapter"]
