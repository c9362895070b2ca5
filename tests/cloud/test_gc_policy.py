"""The garbage collector's policy (`cloud.gc_policy`): what a replica at fleet scale relies on.

Proves: a step freezes what is alive (full collections stop walking it); garbage made of frozen
objects is not reclaimed by an ordinary collection but is by the thaw that comes every
`thaw_every` seconds; a step that is not due a thaw starts no collection at all (a busy
replica's young objects are nearly all alive, and walking them stopped its loop for 30-55 ms
each second), so a young dead cycle is frozen and waits for the thaw too; the running policy times
every collection's pause into `amc_cloud_gc_pause_seconds`, and cancelling it unfreezes
everything and removes its hook; while it runs, young collections wait for the next freeze
(up to `YOUNG_THRESHOLD` net allocations).
These are the real collector's behaviours: nothing is mocked.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from cloud import gc_policy, metrics


class Node:
    """A reference cycle's member (only the cyclic collector can reclaim it)."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    """Every test starts and ends with nothing frozen (the test process goes on)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def _cycle() -> weakref.ref[Node]:
    return weakref.ref(Node())


def test_a_step_freezes_what_is_alive() -> None:
    kept = Node()
    gc_policy.GcPolicy(freeze_every=1, thaw_every=3600).step()
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # out of every generation's sight
    del kept


def test_frozen_garbage_waits_for_the_thaw() -> None:
    policy = gc_policy.GcPolicy(freeze_every=1, thaw_every=3600)
    node = Node()
    ref = weakref.ref(node)
    policy.step()
    del node  # garbage now, but frozen
    gc.collect()
    assert ref() is not None, "an ordinary full collection does not walk frozen objects"
    policy.thaw_every = 0  # the thaw is due
    policy.step()
    assert ref() is None, "the thaw's full collection reclaims it"
    assert gc.get_freeze_count() > 0, "and what is alive is frozen again"


def test_a_step_collects_nothing_until_the_thaw() -> None:
    gc.collect()
    ref = _cycle()  # a dead cycle in the youngest generation
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    policy = gc_policy.GcPolicy(freeze_every=1, thaw_every=3600)
    gc.callbacks.append(count)
    try:
        policy.step()
        assert not started, "a step that is not due a thaw walks nothing"
        assert ref() is not None, "so the dead cycle was frozen along"
        policy.thaw_every = 0
        policy.step()
        assert started == [2], "the thaw is one full collection"
        assert ref() is None, "which reclaims it"
    finally:
        gc.callbacks.remove(count)


def test_disabled_with_zero() -> None:
    assert gc_policy.start(0, 900) is None


def _pauses(generation: int) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "amc_cloud_gc_pause_seconds_count", {"generation": str(generation)}
    )
    return value or 0.0


async def test_running_policy_times_pauses_and_unfreezes_when_stopped() -> None:
    hooks = len(gc.callbacks)
    before = _pauses(2)
    task = gc_policy.start(0.05, 3600)
    assert task is not None
    for _ in range(200):
        await asyncio.sleep(0.01)
        if gc.get_freeze_count():
            break
    assert gc.get_freeze_count() > 0, "the policy froze within its interval"
    gc.collect()  # a full collection, timed by the policy's hook
    assert _pauses(2) > before
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gc.get_freeze_count() == 0
    assert len(gc.callbacks) == hooks


async def test_young_collections_wait_for_the_policy_but_not_forever() -> None:
    """While the policy runs, thousands of young survivors (a fleet's pending reads) start no
    collection; `YOUNG_THRESHOLD` of them do. The process's threshold is restored after."""
    default = gc.get_threshold()
    task = gc_policy.start(3600, 3600)  # no step of its own during the test
    assert task is not None
    await asyncio.sleep(0)
    young: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            young.append(1)

    gc.callbacks.append(count)
    try:
        assert gc.get_threshold()[0] == gc_policy.YOUNG_THRESHOLD
        gc.collect(0)
        young.clear()
        alive = [[n] for n in range(5_000)]
        assert not young, "5,000 survivors started no young collection"
        alive += [[n] for n in range(gc_policy.YOUNG_THRESHOLD)]
        assert young, "the threshold's worth did"
        del alive
    finally:
        gc.callbacks.remove(count)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert gc.get_threshold() == default
