"""An engine that refuses to start leaves the caller's modules as they were, and says which key to change.

It used to move the policy (and drafter) to its device and dtype before its checks: a float64 policy handed to an
engine refused for a bfloat16 pool too small came back in bfloat16, so the caller's next, correct engine decoded
with rounded weights. A pool larger than the machine, or a device it lacks, gave a bare MemoryError, an
allocator's RuntimeError or an AssertionError."""

from __future__ import annotations

import copy
import errno

import pytest
import torch

import fastrl.engine.kv_plan as kv_plan_module
import fastrl.engine.runner as runner_module
from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.kv_plan import KvPlan, TensorMove, incoming_bytes, net_bytes
from fastrl.models.checkpoint import load_model
from fastrl.models.kv_cache import KvShape
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.strategy import Strategy


@pytest.fixture(scope="module")
def pristine():
    policy = load_model(bundled_model_dir()).to(torch.float64).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0].to(torch.float64).eval()
    return policy, drafter


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _unchanged(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = module.state_dict()
    return after.keys() == before.keys() and all(
        after[k].dtype == before[k].dtype and after[k].device == before[k].device and torch.equal(after[k], before[k])
        for k in before
    )


REFUSALS = [
    ({"dtype": "bfloat16", "kv_cache_tokens": 1}, "disable", False, "engine.kv_cache_tokens = 1 cannot hold"),
    ({"dtype": "bfloat16"}, "3_1_4", False, "need a drafter"),
    ({"dtype": "bfloat16", "kv_cache_tokens": 2**50}, "3_1_4", True, "lower engine.kv_cache_tokens"),
    ({"max_batch_size": 2**40, "kv_cache_tokens": 4096}, "disable", False, "engine.max_batch_size"),
    ({"max_batch_size": 2**34, "max_model_len": 1024}, "3_1_4", True, "engine.max_batch_size"),
    ({"device": "gpu"}, "disable", False, "engine.device='gpu' is not a torch device"),
    ({"device": "meta"}, "disable", False, "fastrl runs on cpu or cuda"),
]


@pytest.mark.parametrize(("keys", "strategy", "with_drafter", "said"), REFUSALS)
def test_a_refused_engine_leaves_the_modules_untouched(pristine, keys, strategy, with_drafter, said):
    policy, drafter = (copy.deepcopy(m) for m in pristine)
    before = (_snapshot(policy), _snapshot(drafter))
    selector = FixedSelector(Strategy.parse(strategy))
    with pytest.raises(ValueError, match=said):
        Engine(policy, EngineConfig(**keys), drafter=drafter if with_drafter else None, selector=selector)
    assert _unchanged(policy, before[0]) and _unchanged(drafter, before[1])
    # and the caller's next engine decodes with the weights it was given (float64, as the pristine copy)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    config = EngineConfig(max_batch_size=2, max_model_len=64, dtype="float64")
    got = Engine(policy, config).generate([GenerateInput([1, 5, 9], params)])[0]
    want = Engine(copy.deepcopy(pristine[0]), config).generate([GenerateInput([1, 5, 9], params)])[0]
    assert got.token_ids == want.token_ids and got.logprobs == want.logprobs


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA refuses engine.device=cuda")
def test_a_cuda_device_on_a_machine_without_one_is_named(pristine):
    policy = copy.deepcopy(pristine[0])
    with pytest.raises(ValueError, match="engine.device=cuda: this machine has no CUDA device"):
        Engine(policy, EngineConfig(device="cuda"))
    assert next(policy.parameters()).dtype == torch.float64


def _plan(**changes) -> KvPlan:
    keys = dict(
        slots=4,
        num_pages=64,
        scratch_pages=2,
        columns=16,
        page_size=16,
        caches=(KvShape(2, 2, 8), KvShape(1, 2, 8)),
        dtype=torch.float32,
        device=torch.device("cpu"),
        kv_cache_tokens=None,
    )
    return KvPlan(**(keys | changes))


def test_the_plan_counts_kv_where_it_is_held_at_once():
    plan = _plan()
    # K and V, (2 + 1) layers, 16 entries, 2 heads of 8, 4 bytes, over 64 + 4 x 2 pages
    assert plan.kv_bytes == 2 * 3 * 16 * 2 * 8 * 4 * 72
    lazy, asked = plan.needed_bytes(), _plan(kv_cache_tokens=1024).needed_bytes()
    assert asked - lazy == plan.kv_bytes  # a CPU pool asked for by size is meant to be filled; the default is not
    assert plan.needed_bytes(incoming=1000) == lazy + 1000


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        OverflowError("cannot fit 'int' into an index-sized integer"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:116] DefaultCPUAllocator: can't allocate memory"),
        OSError(errno.ENOMEM, "Cannot allocate memory"),
    ],
)
def test_an_allocation_that_fails_names_the_keys(error):
    with pytest.raises(ValueError, match="could not be allocated .*lower engine.max_batch_size"):
        with _plan().allocating():
            raise error


def test_other_errors_pass_through_the_allocation():
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with _plan().allocating():
            raise RuntimeError("shape mismatch")


def test_the_net_bytes_count_what_arrives_whole_and_what_is_there_by_its_change():
    bf16 = 2
    arriving = TensorMove(on_target=False, numel=10, itemsize=4, is_float=True)
    shrinking = TensorMove(on_target=True, numel=10, itemsize=4, is_float=True)  # float32 there, cast to bfloat16
    growing = TensorMove(on_target=True, numel=10, itemsize=1, is_float=True)  # float8 there, cast to bfloat16
    ints_there = TensorMove(on_target=True, numel=10, itemsize=8, is_float=False)  # kept in their dtype
    ints_arriving = TensorMove(on_target=False, numel=10, itemsize=8, is_float=False)
    assert net_bytes([arriving], bf16) == 20
    assert net_bytes([shrinking], bf16) == -20
    assert net_bytes([growing], bf16) == 10
    assert net_bytes([ints_there], bf16) == 0
    assert net_bytes([ints_arriving], bf16) == 80
    assert net_bytes([arriving, shrinking, growing, ints_there, ints_arriving], bf16) == 90
    assert net_bytes([], bf16) == 0


def _module(device: str) -> torch.nn.Module:
    module = torch.nn.Linear(4, 3, device=device, dtype=torch.float32)  # 15 floats
    module.register_buffer("ids", torch.zeros(5, dtype=torch.int64, device=device))
    return module


def test_modules_already_on_the_device_in_a_wider_dtype_give_bytes_back():
    """A float32 model already on the engine's device, cast to a bfloat16 engine, frees half its floats: the old
    count said 0 (nothing incoming), so the pool was planned (and allocated) beside the float32 weights. The meta
    device stands in for a CUDA one."""
    target = torch.device("meta")
    there, elsewhere = _module("meta"), _module("cpu")
    assert incoming_bytes([there], target, torch.bfloat16) == 15 * (2 - 4)
    assert incoming_bytes([elsewhere], target, torch.bfloat16) == 15 * 2 + 5 * 8
    assert incoming_bytes([there, None, elsewhere], target, torch.bfloat16) == 15 * (2 - 4) + 15 * 2 + 5 * 8
    assert incoming_bytes([there], target, torch.float64) == 15 * (8 - 4)
    assert incoming_bytes([there, there], target, torch.bfloat16) == 15 * (2 - 4)  # a shared tensor counts once
    assert incoming_bytes([elsewhere], torch.device("cpu"), torch.bfloat16) == 0


def test_the_plan_takes_back_the_bytes_a_cast_frees(monkeypatch):
    plan = _plan(device=torch.device("cuda"), dtype=torch.bfloat16)
    monkeypatch.setattr(kv_plan_module, "available_bytes", lambda device: plan.needed_bytes() - 100)
    with pytest.raises(ValueError, match="lower engine.max_batch_size"):
        plan.check(0)
    plan.check(-100)
    with pytest.raises(ValueError, match=r"\(less 0.00 GiB the weights there give back in torch.bfloat16\)"):
        plan.check(-99)


def test_the_modules_move_before_the_pool_is_allocated(pristine, monkeypatch):
    """The pool is allocated in what the modules' move leaves free: they have their engine's dtype by then."""
    seen: list[torch.dtype] = []
    policy = copy.deepcopy(pristine[0])
    real = runner_module.PagePool

    def recording(*args, **kwargs):
        seen.append(next(policy.parameters()).dtype)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "PagePool", recording)
    Engine(policy, EngineConfig(max_batch_size=2, max_model_len=64, dtype="float32"))
    assert seen == [torch.float32]


@pytest.fixture(scope="module")
def engine(pristine):
    return Engine(copy.deepcopy(pristine[0]), EngineConfig(max_batch_size=2, max_model_len=64))


@pytest.mark.parametrize("flag", ["no", 1, None, torch.tensor(True)])
def test_return_hidden_states_must_be_a_bool(engine, flag):
    with pytest.raises(ValueError, match="return_hidden_states must be true or false"):
        engine.add_request([1, 5, 9], SamplingParams(max_new_tokens=2), return_hidden_states=flag)
    good = GenerateInput([1, 5, 9], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="return_hidden_states must be true or false"):
        engine.generate([good, GenerateInput([1, 5], SamplingParams(max_new_tokens=2), None, flag)])
    assert not engine.has_unfinished()  # the good input was not queued either


def test_an_empty_request_id_is_refused(engine):
    with pytest.raises(ValueError, match="a request id must not be empty"):
        engine.add_request([1, 5, 9], SamplingParams(max_new_tokens=2), request_id="")
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    ("part", "value", "message"),
    [
        ("selector", "3_1_4", r"selector must be a StrategySelector \(FixedSelector\(name\)"),
        ("config", {"max_batch_size": 2}, "config must be an EngineConfig or None, got dict"),
        ("drafter", "policy", "drafter must be an EagleDrafter .* got CausalLM"),
        ("history", [], "history must be a HistoryIndex or None, got list"),
        ("model", None, "model must be a CausalLM"),
    ],
)
def test_a_part_of_the_wrong_kind_is_named(pristine, part, value, message):
    """They used to fail deep inside with a bare AttributeError ('str' object has no attribute 'strategies')."""
    policy, _ = pristine
    parts = {"model": policy, part: policy if value == "policy" else value}
    with pytest.raises(ValueError, match=message):
        Engine(**parts)
