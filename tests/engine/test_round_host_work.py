"""A plain round's work does not grow with the batch: the same aten ops and host syncs at 4 rows as at 32."""

from __future__ import annotations

from collections import Counter

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
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


def _round_ops(model, batch: int, prompt_len: int) -> Counter[str]:
    # One page per request (taken at admission), so that the rounds compared take no pages: a round that does
    # adds one table write and one page clear for all its rows together.
    engine = Engine(model, EngineConfig(max_batch_size=batch, max_model_len=128, page_size=256))
    params = SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True)
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
