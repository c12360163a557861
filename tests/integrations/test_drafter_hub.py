"""The drafter hub without Ray: a server that leaves completes the round the others wait on (they waited out the
whole sync timeout and logged a failure), the count of members left says when the hub's job is over, the hub holds
one round's drafters however long the job, and a server added later lines up with the others' round."""

from __future__ import annotations

import asyncio

import torch

from fastrl.cotrain.cotrainer import TrainedDrafter
from fastrl.integrations.verl.drafter_hub import DrafterHub


def test_a_server_that_leaves_completes_the_round_the_others_wait_on():
    async def run():
        hub = DrafterHub(timeout_s=600.0)
        hub.join("a", 0)
        hub.join("b", 0)
        waiting = asyncio.ensure_future(hub.exchange("a", 0, None))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        left = hub.leave("b")
        release = await asyncio.wait_for(waiting, timeout=30)
        return left, release, hub.report()

    left, release, report = asyncio.run(run())
    assert left == 1 and release is None  # nobody trained: no new version
    assert report["members"] == ["a"] and report["failures"] == []


def _trained(base_version: int, value: float) -> TrainedDrafter:
    return TrainedDrafter({"w": torch.full((256, 256), value)}, steps=2, tokens=10, base_version=base_version)


def test_the_hub_holds_one_round_however_many_ran():
    """Each round's offered copies were kept for the whole job ((servers + 1) drafters more a training step); once
    merged they go, and a round is dropped once a later one merged."""

    async def run():
        hub = DrafterHub(timeout_s=600.0)
        hub.join("a", 0)
        hub.join("b", 0)
        for round_index in range(6):
            a = hub.exchange("a", round_index, _trained(hub.version, 1.0))
            b = hub.exchange("b", round_index, _trained(hub.version, 3.0))
            release, same = await asyncio.gather(a, b)
            assert release is same and release.version == round_index + 1
            assert float(release.state["w"][0, 0]) == 2.0
        return hub

    hub = asyncio.run(run())
    assert list(hub._rounds) == [5] and set(hub._rounds[5].offered.values()) == {None}


def test_a_server_added_later_lines_up_with_the_current_round_and_a_late_offer_is_dropped():
    async def run():
        hub = DrafterHub(timeout_s=600.0)
        assert hub.join("a", 0) == 0
        for round_index in range(3):
            await hub.exchange("a", round_index, _trained(hub.version, 1.0))
        assert hub.join("c", 0) == 3  # its first sleep exchanges round 3, with "a"
        a = hub.exchange("a", 3, _trained(hub.version, 1.0))
        c = hub.exchange("c", 3, None)
        release, same = await asyncio.gather(a, c)
        stale = await asyncio.wait_for(hub.exchange("c", 1, _trained(1, 5.0)), timeout=5)  # not a 600 s wait
        return hub, release, same, stale

    hub, release, same, stale = asyncio.run(run())
    assert release is same and release.version == 4 and release.contributors == ["a"]
    assert stale is None and hub.version == 4
    assert hub.report()["failures"] == ["round 1: c offered after a later round merged; its copy is dropped"]


def test_a_diverged_copy_is_left_out_and_the_healthy_ones_merge():
    """One server's non-finite copy used to fail the whole merge (no new version for anyone)."""

    async def run(values):
        hub = DrafterHub(timeout_s=600.0)
        for name in values:
            hub.join(name, 1)
        offers = [hub.exchange(name, 0, _trained(1, value)) for name, value in values.items()]
        return await asyncio.gather(*offers), hub.report()

    for bad in (float("nan"), float("inf")):
        releases, report = asyncio.run(run({"a": 1.0, "b": bad, "c": 3.0}))
        release = releases[0]
        assert all(r is release for r in releases) and release.version == 2 and release.contributors == ["a", "c"]
        assert torch.equal(release.state["w"], torch.full((256, 256), 2.0))  # equal steps: the mean of a and c
        assert report["failures"] == ["merge: b's copy holds non-finite values in w: left out"]
    releases, report = asyncio.run(run({"a": float("nan")}))
    assert releases == [None] and report["version"] == 1 and len(report["failures"]) == 1
