"""OpenAI Chat Completions (compact mode) and Responses (session mode), and the adapter."""

from planner.vendors.openai.adapter import OpenAIAdapter

__all__ = ["OpenAIAdapter"]
