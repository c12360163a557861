"""A decode round's work does not grow with the batch: the same aten ops and host syncs at 4 rows as at 32, for
plain rounds and speculative ones (a chain and a tree; their drafter forwards in one of two regimes, the
drafter-step kernel's or PyTorch's)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.cpu_drafter_step import MAX_ROWS, cpu_drafter_step
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import Strategy
from tests.helpers import make_hf_model

SYNC_OPS = ("aten._local_scalar_dense", "aten.item")  # a tensor's value read by the host (.item(), int(t), ...)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", seed=2).save_pretrained(path)
    return load_model(path)


@pytest.fixture(scope="module")
def drafter(model):
    torch.manual_seed(0)
    return EagleDrafter(model.config)


def _round_ops(model, batch: int, prompt_len: int, strategy: str = "disable", drafter=None) -> Counter[str]:
    # One page per request (taken at admission), so that the rounds compared take no pages: a round that does
    # adds one table write and one page clear for all its rows together.
    selector = FixedSelector(Strategy.parse(strategy))
    config = EngineConfig(max_batch_size=batch, max_model_len=128, page_size=256)
    engine = Engine(model, config, drafter=drafter, selector=selector)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request([3 + (i + j) % 50 for j in range(prompt_len + i % 7)], params)
    engine.step()  # admission and prefill
    engine.step()  # one round, so that the next one is like every other
    with OpCounter() as counter:
        engine.step()
    return counter.ops


def test_a_plain_round_dispatches_the_same_ops_at_any_batch_size_and_length(model):
    small, large, longer = _round_ops(model, 4, 10), _round_ops(model, 32, 10), _round_ops(model, 4, 60)
    assert sum(small.values()) > 0
    assert small == large == longer
    syncs = sum(small[op] for op in SYNC_OPS)
    assert syncs <= 1  # the attention length (the batch's longest row); results come back in one copy


@pytest.mark.parametrize("strategy", ["3_1_4", "2_2_4"])
def test_a_speculative_round_dispatches_the_same_ops_at_any_batch_size_and_length(model, drafter, strategy):
    # Drafter forwards of at most MAX_ROWS new entries run in the drafter-step kernel (a few ops), larger ones in
    # PyTorch: the same ops at every batch size within each of the two regimes.
    small = _round_ops(model, 4, 10, strategy, drafter)
    small_too = _round_ops(model, MAX_ROWS // 4, 10, strategy, drafter)  # catch-up: 4 entries a row at most
    large = _round_ops(model, MAX_ROWS + 8, 10, strategy, drafter)
    large_too = _round_ops(model, 2 * MAX_ROWS, 10, strategy, drafter)
    longer = _round_ops(model, 4, 60, strategy, drafter)
    assert sum(small.values()) > 0
    assert small == small_too == longer
    assert large == large_too
    if cpu_drafter_step() is not None:  # the kernel's regime dispatches fewer ops than PyTorch's
        assert sum(small.values()) < sum(large.values())
    for ops in (small, large):
        syncs = sum(ops[op] for op in SYNC_OPS)
        assert syncs <= 1  # the tree's base (the batch's longest row); results come back in one copy
