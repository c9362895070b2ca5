"""Conversations with a model as typed items (both planning modes) and how they group."""
