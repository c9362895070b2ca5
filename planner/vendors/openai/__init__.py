"""OpenAI Chat Completions (compact mode) and Responses (session mode, and compact mode for the
GPT-5 family), and the adapter."""

from planner.vendors.openai.adapter import OpenAIAdapter

__all__ = ["OpenAIAdapter"]
