"""Embedding vectors for retrieval, from the OpenAI embeddings API with the planner's key.

Optional (`AMC_CLOUD_FLOW_SCORER=openai`): the lexical scorer needs nothing, this one a key and
the network. A call that fails (no key, the provider down, a timeout) returns None and
retrieval scores lexically instead; the failure is logged once per kind, never with the key.
"""

from __future__ import annotations

import logging
from typing import Protocol

from planner.settings import PlannerSettings

log = logging.getLogger(__name__)
#: An embedding call may hold up an assignment this long at most.
TIMEOUT_S = 5.0


class Embedder(Protocol):
    """Turns texts into vectors (None when it cannot right now)."""

    model: str

    async def embed(self, texts: list[str]) -> list[list[float]] | None: ...

    async def aclose(self) -> None: ...


class OpenAIEmbedder:
    """`client.embeddings.create(model=…, input=[…])` through the official SDK."""

    def __init__(self, settings: PlannerSettings, model: str) -> None:
        # The SDKs are imported here, not with the module: every cloud imports this module for
        # `Embedder`, and the two SDKs are most of a process's start (about 2.7 s of CPU).
        import openai

        from planner.vendors.clients import openai_client

        self.model = model
        self._error: type[Exception] = openai.OpenAIError
        self._client = openai_client(
            settings.model_copy(update={"timeout_s": TIMEOUT_S, "max_retries": 0})
        )
        self._failed: set[str] = set()

    async def embed(self, texts: list[str]) -> list[list[float]] | None:
        if not texts:
            return []
        try:
            response = await self._client.embeddings.create(model=self.model, input=texts)
        except self._error as exc:
            kind = type(exc).__name__
            if kind not in self._failed:
                self._failed.add(kind)
                log.warning("flow embeddings unavailable (%s); scoring lexically", kind)
            return None
        ordered = sorted(response.data, key=lambda d: d.index)
        return [list(d.embedding) for d in ordered]

    async def aclose(self) -> None:
        await self._client.close()
