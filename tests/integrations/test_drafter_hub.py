"""The drafter hub without Ray: a server that leaves completes the round the others wait on (they waited out the
whole sync timeout and logged a failure), and the count of members left says when the hub's job is over."""

from __future__ import annotations

import asyncio

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
