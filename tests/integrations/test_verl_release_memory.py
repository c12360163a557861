"""The fastrl backend gives its engines' device memory back between rollouts, as verl's hybrid mode expects of a
rollout (``free_cache_engine``): at ``sleep`` (here forced on with ``release_at_sleep=true``: CPU replicas run in
standalone mode, where ``auto`` releases nothing), at ``release_kv_cache`` before a weight sync, and part by part at
the trainer's ``resume``; the rollouts after it equal the ones before, and requests sent while it is released wait
for it to come back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("verl")

from fastrl.integrations.verl.local import FASTRL, LocalRollout, chat_batch  # noqa: E402
from fastrl.integrations.verl.options import FastrlRolloutOptions  # noqa: E402
from tests.integrations.verl_setup import N_SAMPLES, PROMPTS, verl_config  # noqa: E402

BOTH = ["kv_cache", "weights"]


@pytest.fixture(scope="module")
def stack():
    local = LocalRollout.start(verl_config([f"{FASTRL}release_at_sleep=true"]))
    first = local.agent_loops.generate_sequences(chat_batch(PROMPTS, N_SAMPLES))
    yield local, first
    local.shutdown()


def _all(calls, timeout: float = 60.0) -> None:
    """Await ``calls`` (coroutines) together, within ``timeout`` seconds."""

    async def together() -> None:
        await asyncio.wait_for(asyncio.gather(*calls), timeout=timeout)

    asyncio.run(together())


def _responses(output) -> list[list[int]]:
    batch = output.batch
    return [batch["responses"][i][batch["response_mask"][i].bool()].tolist() for i in range(len(output))]


def _released(local) -> list[list[str]]:
    return [report.memory_released for report in local.reports()]


def test_sleep_releases_the_memory_requests_wait_for_wake_up_and_decode_as_before(stack):
    local, first = stack
    replicas = local.replicas()
    _all([r.sleep() for r in replicas])
    assert _released(local) == [BOTH] * len(replicas)
    outputs = []
    waiting = threading.Thread(
        target=lambda: outputs.append(local.agent_loops.generate_sequences(chat_batch(PROMPTS, N_SAMPLES)))
    )
    waiting.start()
    time.sleep(2.0)
    assert waiting.is_alive() and not outputs  # queued behind the released memory, not failed
    _all([r.wake_up() for r in replicas])
    waiting.join(timeout=120)
    assert outputs and _responses(outputs[0]) == _responses(first)
    assert _released(local) == [[]] * len(replicas)


def test_a_weight_sync_releases_the_kv_cache_and_the_trainer_resumes_part_by_part(stack):
    from fastrl.integrations.verl.adapter import FastrlServerAdapter

    local, first = stack
    replicas = local.replicas()
    rollout, model = local.config.actor_rollout_ref.rollout, local.config.actor_rollout_ref.model
    _all([r.release_kv_cache() for r in replicas])
    assert _released(local) == [["kv_cache"]] * len(replicas)
    _all([r.resume_kv_cache() for r in replicas])
    assert _released(local) == [[]] * len(replicas)

    _all([r.sleep() for r in replicas])
    adapters = [
        FastrlServerAdapter(config=rollout, model_config=model, device_mesh=None, replica_rank=rank)
        for rank in range(len(replicas))
    ]
    _all([a.resume(tags=["weights"]) for a in adapters])
    assert _released(local) == [["kv_cache"]] * len(replicas)  # the weights back first, the pools still the trainer's
    _all([a.resume(tags=["kv_cache"]) for a in adapters])
    assert _released(local) == [[]] * len(replicas)
    again = local.agent_loops.generate_sequences(chat_batch(PROMPTS, N_SAMPLES))
    assert _responses(again) == _responses(first)


@pytest.mark.parametrize(
    ("option", "free_cache_engine", "mode", "releases"),
    [
        ("auto", True, "HYBRID", True),
        ("auto", True, "COLOCATED", True),
        ("auto", True, "STANDALONE", False),
        ("auto", False, "HYBRID", False),
        (True, False, "STANDALONE", True),
        (False, True, "HYBRID", False),
    ],
)
def test_release_at_sleep_follows_verls_free_cache_engine_in_hybrid_mode(option, free_cache_engine, mode, releases):
    options = FastrlRolloutOptions(release_at_sleep=option)
    assert options.releases_at_sleep(free_cache_engine, mode) is releases


@pytest.mark.parametrize("mode", ["HYBRID", "COLOCATED"])
def test_a_forced_release_verl_never_resumes_is_refused(mode):
    """With free_cache_engine=false verl resumes nothing after sleep (no resume(tags), no wake_up): a forced
    release there would leave every later rollout waiting, so it is refused naming both keys."""
    with pytest.raises(ValueError, match=r"release_at_sleep=true with actor_rollout_ref\.rollout\.free_cache_engine"):
        FastrlRolloutOptions(release_at_sleep=True).releases_at_sleep(False, mode)


@pytest.mark.parametrize("bad", ["yes", 1, None, "true"])
def test_a_bad_release_at_sleep_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"custom\.fastrl\.release_at_sleep must be 'auto', true or false"):
        FastrlRolloutOptions(release_at_sleep=bad)
