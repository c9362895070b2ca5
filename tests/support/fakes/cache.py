"""Anthropic prompt caching as documented, for the Messages fake's usage figures and the bench.

A request is read as one sequence of blocks in the order the API renders it: tools, system,
then each message's content blocks. A breakpoint is a block carrying `cache_control`, plus the
last block when the request carries a request-level `cache_control`. A request reads the longest
prefix some earlier request wrote, ending at most 20 blocks before one of its breakpoints, and
writes the prefix up to each of its breakpoints (prefixes shorter than the model's minimum are
not cached). Tokens are estimated as a quarter of the JSON characters: the fake has no tokenizer,
and the benchmark compares like with like.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

LOOKBACK_BLOCKS = 20


def tokens(value: Any) -> int:
    """An estimate: a quarter of the JSON characters (at least 1 for anything non-empty)."""
    raw = json.dumps(_plain(value), sort_keys=True, ensure_ascii=False)
    return max(1, len(raw) // 4)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's cacheable blocks in rendering order (tools, system, message content)."""
    out: list[dict[str, Any]] = [dict(t) for t in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str):
        out.append({"type": "text", "text": system})
    elif isinstance(system, list):
        out.extend(dict(b) for b in system)
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            out.append({"type": "text", "text": content, "role": message.get("role")})
        else:
            out.extend({**b, "role": message.get("role")} for b in content or [])
    if body.get("cache_control") and out:
        out[-1] = {**out[-1], "cache_control": body["cache_control"]}
    return out


@dataclass(frozen=True, slots=True)
class CacheUse:
    """One request's input tokens: uncached, read from the cache, written to it."""

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int

    def billed(self) -> float:
        """Input tokens at the normal rate's price: writes cost 1.25x, reads 0.1x (5-minute
        cache, Anthropic's published multipliers)."""
        return (
            self.input_tokens
            + 1.25 * self.cache_creation_input_tokens
            + 0.1 * self.cache_read_input_tokens
        )


class PromptCache:
    """The prefixes cached so far (for one model); `account` prices a request and updates it."""

    def __init__(self, min_tokens: int = 1024) -> None:
        self.min_tokens = min_tokens
        self._cached: set[str] = set()

    def account(self, body: dict[str, Any], total: int | None = None) -> CacheUse:
        """Price `body`. `total` is the request's input tokens (default: its blocks' sum)."""
        items = blocks(body)
        sizes = [tokens(b) for b in items]
        prefix: list[int] = []
        hashes: list[str] = []
        running, digest = 0, hashlib.sha256(str(body.get("model")).encode())
        for block, size in zip(items, sizes, strict=True):
            running += size
            digest.update(json.dumps(_plain(block), sort_keys=True).encode())
            prefix.append(running)
            hashes.append(digest.copy().hexdigest())
        whole = total if total is not None else running
        breakpoints = [i for i, b in enumerate(items) if b.get("cache_control")]
        read_at = -1
        for b in breakpoints:
            for i in range(b, max(-1, b - LOOKBACK_BLOCKS - 1), -1):
                if hashes[i] in self._cached:
                    read_at = max(read_at, i)
                    break
        read = prefix[read_at] if read_at >= 0 else 0
        written = [b for b in breakpoints if b > read_at and prefix[b] >= self.min_tokens]
        write = prefix[max(written)] - read if written else 0
        for b in breakpoints:
            if prefix[b] >= self.min_tokens:
                self._cached.add(hashes[b])
        return CacheUse(max(0, whole - read - write), read, write)
