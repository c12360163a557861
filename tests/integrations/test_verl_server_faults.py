"""One ``FastrlServer`` in this process (its engine worker and the drafter hub real Ray actors), driven as verl's
trainers drive it where they leave the usual path: a co-trained copy the engine cannot hand over at ``sleep``, a
weight commit without ``global_steps`` (verl v1's re-sync at validation), one request id sent twice at once (verl's
v1 trainer with ``rollout.full_determinism``)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

pytest.importorskip("verl")

import ray  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from fastrl.assets_path import bundled_model_dir  # noqa: E402
from fastrl.integrations.verl.drafter_hub import DrafterHub  # noqa: E402
from fastrl.integrations.verl.server import FastrlServer  # noqa: E402
from fastrl.rollout.cluster import ensure_ray  # noqa: E402
from tests.integrations.verl_setup import verl_config  # noqa: E402

HUB_TIMEOUT_S = 20.0
PROMPT = [1, 20, 51, 7]


@pytest.fixture(scope="module")
def served():
    """A ready server ("faults-0"), its hub (which a second, fake member "peer-0" has joined) and the one event loop
    every test runs the server's calls in (its events and tasks belong to one loop, as in its Ray actor)."""
    owns = ensure_ray(None, 2)
    hub = ray.remote(DrafterHub).options(num_cpus=0).remote(HUB_TIMEOUT_S)
    config = verl_config().actor_rollout_ref
    server = FastrlServer(config.rollout, config.model, "faults-0", hub=hub)
    ray.get(hub.join.remote("peer-0", 0))
    loop = asyncio.new_event_loop()
    loop.run_until_complete(server.ready())
    yield server, hub, loop
    try:
        loop.run_until_complete(server.shutdown())
    finally:
        loop.close()
        ray.kill(hub)
        if owns:
            ray.shutdown()


def _fail_the_next_handover(actor) -> None:
    """Run inside the engine actor (``__ray_call__``): its next ``trained_drafter`` raises, as a copy that cannot
    be made (out of memory) does."""
    worker, failures = actor._worker, [MemoryError("copying the trained drafter")]
    original = worker.cotrainer.trained

    def trained():
        if failures:
            raise failures.pop()
        return original()

    worker.cotrainer.trained = trained


def test_a_copy_that_cannot_be_handed_over_is_logged_and_its_peers_merge_without_waiting(served, caplog):
    """The engine's error failed ``sleep`` (a RayTaskError failing verl's training step) and the server never
    offered its round, so a peer waited the hub's whole timeout; fastrl's own rollout manager counts the same
    failure as a failed drafter round and goes on."""
    server, hub, loop = served

    async def scenario() -> float:
        await server._worker.__ray_call__.remote(_fail_the_next_handover)
        peer = hub.exchange.remote("peer-0", 0, None)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="fastrl.verl"):
            await server.sleep()
        await peer
        return time.monotonic() - started

    waited = loop.run_until_complete(scenario())
    assert waited < HUB_TIMEOUT_S / 2
    lines = [r.getMessage() for r in caplog.records if "not merged" in r.getMessage()]
    assert lines == ["fastrl server faults-0: co-trained drafter not merged: MemoryError: copying the trained drafter"]
    report = ray.get(hub.report.remote())
    assert report["next_round"] == 1 and report["failures"] == [] and server._rollouts == 1


def _greedy(request_id: str) -> dict:
    return {"prompt_ids": PROMPT, "sampling_params": {"temperature": 0.0, "max_tokens": 12}, "request_id": request_id}


def test_a_commit_without_global_steps_keeps_the_version_of_the_weights_it_reinstalls(served):
    """verl's v1 trainer re-installs the current step's weights at validation without ``global_steps``: the same
    weights were labelled version + 1, the label the next step's new weights got as well."""
    server, _, loop = served
    state = load_file(str(bundled_model_dir() / "model.safetensors"))

    async def scenario() -> list[tuple[int, object, object]]:
        seen = []
        for steps in (3, None, 4):
            await server.receive_weights(dict(state))
            version = await server.commit_weights(steps)
            out = await server.generate(**_greedy(f"commit-{steps}"))
            seen.append((version, out.extra_fields["fastrl_policy_version"], out.extra_fields["global_steps"]))
        return seen

    assert loop.run_until_complete(scenario()) == [(3, 3, 3), (3, 3, 3), (4, 4, 4)]


def test_an_id_already_in_flight_is_refused_naming_full_determinism_and_verls_v1_trainer(served):
    """verl 0.9.1's v1 agent loop sets no priority, so with full_determinism every request is "det-0": the
    engine's refusal named neither the key nor the cause. A finished id may come again (a multi-turn loop's)."""
    server, _, loop = served

    async def scenario() -> list:
        calls = [server.generate(**_greedy("det-0")) for _ in range(2)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        results.append(await server.generate(**_greedy("det-0")))
        return results

    first, second, again = loop.run_until_complete(scenario())
    assert len(first.token_ids) > 0 and again.token_ids == first.token_ids
    assert isinstance(second, ValueError)
    said = str(second)
    assert "request id 'det-0' is already running on this server" in said
    assert "actor_rollout_ref.rollout.full_determinism=true" in said and "trainer.use_v1=false" in said
