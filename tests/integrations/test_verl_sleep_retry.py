"""A sleep whose memory release failed is retried from where it failed: the drafter merge round it offered is not
offered again (the hub would merge that server alone into a version its peers never get, and it would stay a round
ahead of them), and the release is. One ``FastrlServer`` in this process, its worker and the drafter hub real Ray
actors; the release made to fail once by a fault injected into the server's own ``_release``."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")

import ray  # noqa: E402

from fastrl.integrations.verl.drafter_hub import DrafterHub  # noqa: E402
from fastrl.integrations.verl.local import FASTRL  # noqa: E402
from fastrl.integrations.verl.server import FastrlServer  # noqa: E402
from fastrl.rollout.cluster import ensure_ray  # noqa: E402
from tests.integrations.verl_setup import verl_config  # noqa: E402


def test_a_retried_sleep_releases_without_offering_its_merge_round_again():
    owns = ensure_ray(None, 2)
    hub = ray.remote(DrafterHub).options(num_cpus=0).remote(2.0)
    config = verl_config([f"{FASTRL}release_at_sleep=true"]).actor_rollout_ref
    server = FastrlServer(config.rollout, config.model, "retry-0", hub=hub)

    async def scenario() -> None:
        await server.ready()
        released = server._release
        failures = [RuntimeError("injected: the release at sleep failed")]

        async def failing_once(parts):
            if failures:
                raise failures.pop()
            return await released(parts)

        server._release = failing_once
        with pytest.raises(RuntimeError, match="injected"):
            await server.sleep()
        merged = await hub.report.remote()
        assert server._rollouts == 1 and merged["next_round"] == 1 and (await server.report()).memory_released == []
        await server.sleep()  # verl's retry: the release alone
        assert server._rollouts == 1 and await hub.report.remote() == merged
        assert sorted((await server.report()).memory_released) == ["kv_cache", "weights"]
        await server.sleep()  # asleep already: nothing more
        assert server._rollouts == 1
        await server.wake_up()
        await server.sleep()  # the next rollout's merge round
        assert server._rollouts == 2 and (await hub.report.remote())["next_round"] == 2
        await server.shutdown()

    try:
        asyncio.run(scenario())
    finally:
        ray.kill(hub)
        if owns:
            ray.shutdown()
