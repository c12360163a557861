"""Co-training faults on one worker never break a rollout: a failure in a round's end (its held-out measure or its
totals) is reported as ``"<worker id>: <error>"`` like a slice's, the rollout's results are kept, and the drafter
stays as it was; a refused drafter push changes nothing and says which tensor is wrong."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.cotrain.schedule import CotrainSchedule
from fastrl.rollout.engine_worker import EngineWorker
from fastrl.rollout.local import WORKER_ID, LocalRollout
from fastrl.rollout.types import DRAFT_VOCAB_KEY
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config

STEPS = CotrainSchedule(mode="steps", updates_per_rollout=2, heldout_fraction=0.3)


def _raise(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("injected round failure")


def _same(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", ["heldout_top1", "take_round"])
def test_round_failure_is_reported_and_the_rollout_kept(checkpoint, method):
    backend = LocalRollout(worker_config(checkpoint, schedule=STEPS))
    requests = mixed_requests(8)
    version, before = backend.drafter_state()
    setattr(backend.worker.cotraining, method, _raise)  # the injected fault, on this worker's co-training only
    batch = backend.generate(requests)
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    assert batch.drafter.failures == [f"{WORKER_ID}: RuntimeError: injected round failure"]
    assert batch.drafter.steps == 0 and batch.drafter_version == version == backend.drafter_version
    assert backend.worker.trained_drafter() is None  # nothing of the failed round is left to publish
    assert _same(backend.drafter_state()[1], before)
    delattr(backend.worker.cotraining, method)  # the fault is gone: the next round trains and publishes
    again = backend.generate(mixed_requests(8, prefix="again"))
    assert again.drafter.failures == [] and again.drafter.steps == STEPS.updates_per_rollout
    assert again.drafter_version == version + 1


def test_heldout_measure_failure_does_not_raise(checkpoint):
    worker = EngineWorker("w-measure", worker_config(checkpoint, schedule=STEPS))
    worker.generate(mixed_requests(8))
    assert worker.heldout_top1()[0] > 0
    worker.cotraining.heldout_top1 = _raise
    assert worker.heldout_top1() == (0, 0.0)


def test_final_step_failure_names_the_worker(checkpoint):
    poisoned = DrafterTrainerConfig(warmup_steps=0, max_tokens_per_batch=512)
    poisoned.lr = float("inf")  # past the config's own check: training fails within the round's final updates
    worker = EngineWorker("w-final", worker_config(checkpoint, trainer=poisoned, schedule=STEPS))
    worker.generate(mixed_requests(8))
    report = worker.finish_drafter_round()
    assert len(report.failures) == 1 and report.failures[0].startswith("w-final: FloatingPointError: ")
    assert report.steps == 0 and worker.trained_drafter() is None


def test_a_rollout_with_non_finite_features_is_left_out_and_reported(checkpoint):
    """One NaN feature (a policy overflowing on one rollout) costs that rollout's data, not the round's training."""
    worker = EngineWorker("w-nan", worker_config(checkpoint, schedule=STEPS))
    add, poisoned = worker.cotraining.add, []

    def poison_first(request_id, seq, prompt):
        if not poisoned:
            seq.features[1, 0] = float("nan")
            poisoned.append(request_id)
        add(request_id, seq, prompt)

    worker.cotraining.add = poison_first
    worker.generate(mixed_requests(8))
    report = worker.finish_drafter_round()
    assert report.failures == ["w-nan: 1 rollouts' features were not finite: left out of co-training"]
    assert report.steps == STEPS.updates_per_rollout and worker.trained_drafter() is not None
    assert all(s.finite for s in worker.cotraining.buffer.sequences())


def _bad_shape(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    return state | {"fc.bias": torch.zeros(3)}, "fc.bias"


def _not_finite(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    return state | {"fc.bias": torch.full_like(state["fc.bias"], float("nan"))}, "fc.bias"


def _integer(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    return state | {"fc.bias": state["fc.bias"].long()}, "fc.bias"


def _missing(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    return {k: v for k, v in state.items() if k != "fc.bias"}, "fc.bias"


def _unexpected(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    return state | {"head.weight": torch.zeros(2, 2)}, "head.weight"


def _bad_vocab(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    return state | {DRAFT_VOCAB_KEY: torch.tensor([0, 10**6])}, "draft_vocab"


def _narrow_vocab(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], str]:
    """A valid vocabulary narrower than a strategy's candidates a step: every round of it would fail."""
    return state | {DRAFT_VOCAB_KEY: torch.tensor([5])}, "draft vocabulary \\(1 ids\\) is narrower than strategy"


@pytest.mark.parametrize("fault", [_bad_shape, _not_finite, _integer, _missing, _unexpected, _bad_vocab, _narrow_vocab])
def test_refused_drafter_load_changes_nothing(checkpoint, fault):
    backend = LocalRollout(worker_config(checkpoint, cotrain=False))
    version, before = backend.drafter_state()
    moved = {k: v + 1.0 if v.is_floating_point() else v for k, v in before.items()}  # a whole other drafter...
    bad, name = fault(moved)  # ... but for one wrong entry
    with pytest.raises(ValueError, match=name):
        backend.load_drafter_state(version + 1, bad)
    assert backend.drafter_version == version and _same(backend.drafter_state()[1], before)
    backend.load_drafter_state(version + 1, moved)  # a whole state still loads
    assert backend.drafter_version == version + 1 and _same(backend.drafter_state()[1], moved)


def test_the_samples_of_a_prompt_fall_on_one_side_of_the_held_out_split(checkpoint):
    """The split went by request id, so a GRPO group's samples landed on both sides: their prompt entries are equal
    bit for bit, and the held-out top-1 partly measured what the drafter had just trained on. It goes by the prompt:
    every group is held out whole or trained on whole."""
    from fastrl.rollout.types import RolloutRequest
    from fastrl.sampling.params import SamplingParams
    from tests.rollout.conftest import prompt

    schedule = CotrainSchedule(mode="steps", updates_per_rollout=0, heldout_fraction=0.5)
    worker = EngineWorker("w-split", worker_config(checkpoint, schedule=schedule))
    groups, samples = 12, 4
    requests = [
        RolloutRequest(
            f"g{g}-s{i}",
            prompt(g),
            SamplingParams(max_new_tokens=6, seed=10 * g + i, temperature=1.0, ignore_eos=True),
            g,
        )
        for g in range(groups)
        for i in range(samples)
    ]
    worker.generate(requests)
    worker.cotraining.commit()
    held = sum(schedule.is_heldout(prompt(g)) for g in range(groups))
    assert 0 < held < groups  # both sides are there
    assert len(worker.cotraining._heldout) == held * samples
    assert len(worker.cotraining.buffer.sequences()) == (groups - held) * samples
