"""EngineWorker (no Ray): rollouts fill the buffer with exactly the policy's features, weight pushes are versioned
and respect tied weights, co-training slices never touch the live drafter."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.cotrain.features import policy_features
from fastrl.engine.config import EngineConfig
from fastrl.models.checkpoint import load_model
from fastrl.rollout.engine_worker import EngineWorker
from fastrl.rollout.types import RolloutRequest
from fastrl.rollout.worker_config import RolloutWorkerConfig
from fastrl.sampling.params import SamplingParams
from tests.helpers import make_hf_model
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config


@pytest.fixture(scope="module")
def worker(checkpoint) -> EngineWorker:
    return EngineWorker("w0", worker_config(checkpoint))


def test_results_and_features_are_the_policys(worker, checkpoint):
    requests = mixed_requests(8)
    results = worker.generate(requests)
    assert_same_tokens(results, reference(checkpoint.policy, requests))
    for r, q in zip(results, requests, strict=True):
        assert r.worker_id == "w0" and r.policy_version == 0 and r.group == q.group
    stored = worker.buffer.sample(10**9, random.Random(0))
    assert len(stored) == sum(len(r.token_ids) >= 2 for r in results)
    policy = load_model(checkpoint.policy)
    for r in results:
        if len(r.token_ids) < 2:
            continue
        full = r.prompt_ids + r.token_ids
        seq = next(s for s in stored if s.tokens.tolist() == full[1:])  # the prompt's entries are kept too
        assert seq.start_position == 1 and seq.policy_version == 0
        teacher = policy_features(policy, [full])[0]  # entries for positions 1..T
        assert torch.allclose(seq.features, teacher.features, atol=1e-4)
    stats = worker.stats()
    assert stats.requests_served >= 8 and stats.rounds > 0 and stats.strategy_rounds.get("3_2_4", 0) > 0
    assert stats.buffer_sequences == len(stored) and stats.mean_accept_length >= 1.0
    rounds = worker.take_rounds()
    assert rounds and all(r.strategy == "3_2_4" and r.worker_id == "w0" for r in rounds)
    assert worker.take_rounds() == []


def test_invalid_request_is_an_error_result(worker):
    too_long = RolloutRequest("long", list(range(3, 300)), SamplingParams(max_new_tokens=4, seed=0))
    result = worker.generate([too_long])[0]
    assert result.finish_reason == "error" and result.error and result.token_ids == []


def test_slice_trains_a_copy_and_versions_follow_pushes(worker):
    if not worker.buffer.num_sequences:
        worker.generate(mixed_requests(6, prefix="fill"))
    version, live = worker.drafter_state()
    metrics = worker.train_drafter_slice(0.2)
    assert metrics.error is None and metrics.steps > 0
    assert all(torch.equal(live[k], v) for k, v in worker.drafter_state()[1].items())
    trained = worker.trained_drafter()
    assert trained is not None and trained.base_version == version and trained.steps == metrics.steps
    worker.update_drafter(version + 1, trained.state)
    assert worker.drafter_state()[0] == version + 1 and worker.trained_drafter() is None
    assert all(torch.equal(trained.state[k], v) for k, v in worker.drafter_state()[1].items())
    stopped = worker.train_drafter_slice(1.0, should_stop=lambda: True)
    assert stopped.steps == 0 and stopped.stopped


def test_tied_policy_update_with_or_without_lm_head(tmp_path):
    make_hf_model("llama_tied", seed=0).save_pretrained(tmp_path / "v0")
    make_hf_model("llama_tied", seed=1).save_pretrained(tmp_path / "v1")
    config = worker_config_plain(str(tmp_path / "v0"))
    worker = EngineWorker("tied", config)
    new = load_model(tmp_path / "v1").state_dict()
    assert "lm_head.weight" in new
    request = RolloutRequest("a", [5, 6, 7], SamplingParams(max_new_tokens=8, temperature=0.0))
    for state in (new, {k: v for k, v in new.items() if k != "lm_head.weight"}):
        worker.update_policy(3, state)
        assert worker.policy.lm_head.weight is worker.policy.model.embed_tokens.weight
        result = worker.generate([request])[0]
        assert result.policy_version == 3
        assert_same_tokens([result], reference(str(tmp_path / "v1"), [request]))
    with pytest.raises(ValueError, match="missing tensors"):
        worker.update_policy(4, {"model.norm.weight": new["model.norm.weight"]})
    # a head of its own beside the embeddings (a trainer whose tying broke) was dropped without a word, and the
    # rollouts sampled from another policy than the trainer's
    untied = {**new, "lm_head.weight": new["lm_head.weight"] + 0.5}
    with pytest.raises(ValueError, match="pushed policy weights: .* lm_head.weight that is not model.embed_tokens"):
        worker.update_policy(4, untied)
    assert worker.policy_version == 3
    assert_same_tokens(worker.generate([request]), reference(str(tmp_path / "v1"), [request]))
    assert worker.drafter is None and worker.cotrainer is None
    assert worker.drafter_state() == (0, {}) and worker.train_drafter_slice(0.1).skipped is not None


def worker_config_plain(model_dir: str) -> RolloutWorkerConfig:
    return RolloutWorkerConfig(model_dir=model_dir, strategy="disable", cotrain=False, engine={"max_batch_size": 2})


def test_pushes_that_overflow_the_engines_dtype_are_refused(checkpoint):
    """A finite float32 value past float16's range is infinite once cast into a float16 engine: the push is refused
    naming it, as a checkpoint is at load, and the live weights and versions stay as they were."""
    half = EngineWorker("w16", worker_config(checkpoint, engine=EngineConfig(max_batch_size=4, dtype="float16")))
    policy = {k: v.float().clone() for k, v in half.engine.model.state_dict().items()}
    policy["model.norm.weight"][0] = 1e5
    with pytest.raises(ValueError, match=r"pushed policy weights: weights overflow to infinity in torch.float16"):
        half.update_policy(1, policy)
    drafter = {k: v.float().clone() for k, v in half.drafter.state_dict().items()}
    drafter["fc.weight"][0, 0] = -1e6
    with pytest.raises(ValueError, match=r"pushed drafter weights: weights overflow to infinity .*\['fc.weight'\]"):
        half.update_drafter(half.drafter_version + 1, drafter)
    assert torch.isfinite(half.engine.model.model.norm.weight).all() and torch.isfinite(half.drafter.fc.weight).all()
    assert half.policy_version == 0
    del policy["model.norm.weight"]
    with pytest.raises(ValueError, match=r"pushed policy weights does not match the config: missing tensors"):
        half.update_policy(1, policy)


def test_a_copy_that_cannot_be_handed_over_is_dropped(worker, monkeypatch):
    """The next round starts afresh instead of failing the same way for ever."""
    if not worker.buffer.num_sequences:
        worker.generate(mixed_requests(6, prefix="handover"))
    assert worker.train_drafter_slice(0.2).steps > 0 and worker.cotrainer.trained() is not None

    def failing() -> None:
        raise MemoryError("copying the trained drafter")

    monkeypatch.setattr(worker.cotrainer, "trained", failing)
    with pytest.raises(MemoryError):
        worker.trained_drafter()
    monkeypatch.undo()
    assert worker.cotrainer.trained() is None


@pytest.mark.parametrize("mode", ["time", "steps"])
def test_the_rounds_held_out_measure_before_the_push_reads_the_rollouts_own_held_out_set(checkpoint, mode):
    """On the wall-clock schedule a worker that ran no slice in the rollout (a Ray worker's submit and step path,
    the tail worker always) measured its held-out top-1 "before" on the previous rollout's held-out set, or on none,
    and the "after" measure on this one's: the two compared different data."""
    from fastrl.cotrain.schedule import CotrainSchedule

    schedule = CotrainSchedule(mode=mode, heldout_fraction=0.5)
    worker = EngineWorker("w0", worker_config(checkpoint, schedule=schedule))
    for rollout in range(2):
        requests = mixed_requests(8, prefix=f"r{rollout}")
        assert any(schedule.is_heldout(r.prompt_ids) for r in requests)
        for request in requests:  # the Ray actor's path: submit, then step until done (no commit of its own)
            worker.submit(request)
        while worker.has_unfinished():
            worker.step()
        report = worker.finish_drafter_round()
        after = worker.heldout_top1()
        assert report.heldout_tokens == after[0] > 0
        worker.update_policy(worker.policy_version + 1, dict(worker.policy.state_dict()))


def test_an_interrupted_generate_leaves_the_worker_as_before_the_call(checkpoint):
    """Ctrl-C inside EngineWorker.generate left its requests running: a retry was refused ("already running") and
    another batch ran them all to their end inside its own call."""
    import os
    import signal

    worker = EngineWorker("w0", worker_config(checkpoint, cotrain=False))
    requests = mixed_requests(8, prefix="cut")
    real, steps = worker.engine.step, []

    def interrupted():
        steps.append(1)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # held to the step's end
        return real()

    worker.engine.step = interrupted
    with pytest.raises(KeyboardInterrupt):
        worker.generate(requests)
    worker.engine.step = real
    assert not worker.has_unfinished() and worker.stats().running_requests == 0
    assert_same_tokens(worker.generate(requests), reference(checkpoint.policy, requests))
