"""Every round a CUDA graph holds, run on the CPU under a guard against what a capture refuses: host data copied to
the device (`torch.tensor(list)`, `t[i] = 1.0` on one element), host synchronisations (`.item()`, `.tolist()`,
`bool(t)`, `nonzero`, `repeat_interleave` by a tensor without `output_size`). On a GPU each of these fails the
capture ("Cannot copy between CPU and CUDA tensors during CUDA graph capture", "operation not permitted when
stream is capturing"), so every engine with `cuda_graphs` on would fail at start; this finds them without one.
The runner is built as on a GPU (a padding slot past the batch, its pages in the pool), the rounds through
`ModelRunner(graph_capture=...)`; a replay then runs the round again into the captured outputs, so whole
generations go through the engine's graph path here and are held to the eager engine's tokens."""

from __future__ import annotations

import random
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import fastrl.engine.runner as runner_module
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.runner import ModelRunner
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from fastrl.strategy.strategy import Strategy
from tests.helpers import triton_or_skip

SYNCS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "masked_select", "unique"}
HOST_DATA = {"tensor", "as_tensor", "from_numpy", "cpu", "numpy", "argwhere"}


class CaptureRefuses(RuntimeError):
    """An op a CUDA-graph capture would refuse, called from fastrl's code inside a round."""


class CaptureGuard(TorchFunctionMode):
    """Raises `CaptureRefuses` on the ops above when code under `scope` (a path part: fastrl's own) calls them
    (what Triton's interpreter or PyTorch do inside an op is theirs: on a GPU their launches are capturable)."""

    def __init__(self, scope: str = "/fastrl/") -> None:
        super().__init__()
        self.scope = scope

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        caller = sys._getframe(1).f_code.co_filename
        if self.scope in caller.replace("\\", "/"):
            refused = name in SYNCS or name in HOST_DATA
            if name == "__setitem__" and len(args) > 2 and not isinstance(args[2], torch.Tensor):
                refused = True  # a host scalar: copied (0-dim destinations) rather than filled
            if name == "repeat_interleave" and isinstance(args[1] if len(args) > 1 else None, torch.Tensor):
                refused = refused or kwargs.get("output_size") is None
            if refused:
                raise CaptureRefuses(f"{name} called from {caller}:{sys._getframe(1).f_lineno}")
        return func(*args, **kwargs)


def guarded_capture(fn, scope: str = "/fastrl/"):
    """A capture's stand-in: a warm-up call (as the real capture makes), then the captured call under the guard."""
    fn()
    with CaptureGuard(scope):
        return fn()


def test_the_guard_catches_a_host_scalar_written_to_one_element():
    here = "/tests/engine/test_graph_capture_safety"
    with pytest.raises(CaptureRefuses, match="__setitem__"):
        guarded_capture(_writes_one_element, here)
    with pytest.raises(CaptureRefuses, match="item"):
        guarded_capture(lambda: torch.ones(2).sum().item(), here)
    assert guarded_capture(lambda: torch.ones(2).sum(), here).shape == ()  # device work alone passes


def _writes_one_element():
    first = torch.zeros(4, dtype=torch.bool)
    first[0] = True
    return first


CASES = {  # backend, strategies, batch: the interpreter is slow, so the kernel's case is smaller
    "pytorch-plain": ("pytorch", ["disable"], 5),
    "pytorch-chains": ("pytorch", ["3_1_4", "5_1_6", "8_1_9@0.3"], 5),
    "pytorch-trees": ("pytorch", ["3_2_6", "6_4_24", "8_8_64"], 5),
    "triton": ("triton", ["5_1_6", "2_2_4"], 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_graphed_round_is_capturable(case, monkeypatch):
    """Plain rounds per bucket and drafter + verify rounds per strategy and bucket, under the guard, on a runner
    laid out as on a GPU (the padding slot's home pages are in the pool: one more slot than the batch), attending
    with `PagedSdpa` or with the GPU's Triton kernel (in Triton's interpreter here)."""
    backend, strategies, batch = CASES[case]
    if backend == "triton":
        triton_or_skip()
        from fastrl.models.gpu_attention import PagedTritonAttention

        monkeypatch.setattr(runner_module, "attention_backend", lambda *args: PagedTritonAttention())
    policy = load_model(bundled_model_dir())
    parsed = [Strategy.parse(s) for s in strategies]
    drafter = load_drafter(bundled_drafter_dir(), policy)[0] if any(s.uses_drafter for s in parsed) else None
    config = EngineConfig(max_batch_size=batch, max_model_len=96, device="cpu", attention_kernel=backend == "triton")
    with torch.inference_mode():
        runner = ModelRunner(policy, config, drafter, parsed, graph_capture=guarded_capture)
    assert runner.graphs is not None
    buckets = [b for b in (1, 2, 4, 5) if b <= batch]
    assert sorted(runner.graphs.plain) == buckets
    eagle = [s for s in parsed if s.uses_drafter and not s.stops_early]  # confidence stops run eagerly
    assert sorted(runner.graphs.spec, key=str) == sorted(((s, b) for s in eagle for b in buckets), key=str)
    slots = batch + 1
    assert runner.table.num_slots == slots and runner.pool.home_stride * slots <= runner.table.num_pages


def test_a_fused_drafters_rounds_are_capturable():
    policy = load_model(bundled_model_dir())
    drafter = FusedEagleDrafter(policy.config, (0,)).eval()
    config = EngineConfig(max_batch_size=3, max_model_len=64, device="cpu", attention_kernel=False)
    with torch.inference_mode():
        runner = ModelRunner(policy, config, drafter, [Strategy.parse("3_2_6")], graph_capture=guarded_capture)
    assert sorted(b for _, b in runner.graphs.spec) == [1, 2, 3]


@pytest.mark.parametrize("strategy", ["disable", "3_1_4", "3_2_6", "6_4_24", "8_1_9@0.3", "bandit"])
def test_generating_through_the_graph_path_equals_eager_rounds(strategy, monkeypatch):
    """The engine's graph path end to end on the CPU (each replay runs the round again into the captured outputs):
    static inputs loaded per round, batches padded to their bucket on the padding slot, trees at the fixed base past
    `max_model_len`; in float64 it generates the eager engine's tokens, log-probs to rounding, for mixed sampling
    settings over batches that shrink through the buckets (1, 2, 4, 5: a batch of 3 pads one row)."""
    from functools import partial

    import fastrl.engine.engine as engine_module
    from fastrl.adaptive.factory import build_selector
    from fastrl.engine.engine import Engine, GenerateInput
    from fastrl.models.tokenizer import load_tokenizer
    from fastrl.rl.tasks.task import ArithChainTask
    from fastrl.sampling.params import SamplingParams

    rng = random.Random(3)
    tokenizer = load_tokenizer(bundled_model_dir())
    settings = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_p=0.9), dict(top_k=3)]
    prompts = [tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"] for _ in range(16)]
    prompts = [p for p in prompts if len(p) <= 100][:9]
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=rng.randint(8, 40), seed=50 + i, **settings[i % 4]))
        for i, p in enumerate(prompts)
    ]
    runs = []
    for graphs in (False, True):
        policy = load_model(bundled_model_dir())
        drafter = None if strategy == "disable" else load_drafter(bundled_drafter_dir(), policy)[0]
        config = EngineConfig(5, 160, "cpu", "float64", cuda_graphs=graphs, attention_kernel=False)  # as on a GPU
        if graphs:
            monkeypatch.setattr(engine_module, "ModelRunner", partial(ModelRunner, graph_capture=guarded_capture))
        engine = Engine(policy, config, drafter=drafter, selector=build_selector(strategy))
        assert (engine.runner.graphs is not None) == graphs
        runs.append(engine.generate(inputs))
    for eager, graphed in zip(*runs, strict=True):
        assert graphed.token_ids == eager.token_ids
        assert max(abs(a - b) for a, b in zip(graphed.logprobs, eager.logprobs, strict=True)) < 1e-9
