"""The drafter-step kernel against the drafter's PyTorch forward over the same paged cache, on randomised forwards
(model families with and without q/k/v biases, fused and last-layer drafters, ragged rows, chains and trees of new
entries, padding, both float types); where it does not run; weights that change under it; and engines with it
generating what plain decoding generates."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.cpu_attention import PagedCpuAttention
from fastrl.models.kv_cache import PageTable
from fastrl.models.masks import attention_mask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.cpu_drafter_step import MAX_ROWS, CpuDrafterStep, cpu_drafter_step
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import Strategy
from tests.helpers import make_hf_model, random_tree_mask
from tests.speculative.fused_helpers import random_fused_drafter

FAMILIES = ("llama", "qwen2", "llama_tied")


@pytest.fixture(scope="module")
def step() -> CpuDrafterStep:
    runner = cpu_drafter_step()
    if runner is None or PagedCpuAttention.load() is None:
        pytest.skip("no C++ compiler on this machine: the kernels cannot be built")
    return runner


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    found = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        make_hf_model(family, seed=3).save_pretrained(path)
        found[family] = path
    return found


def _drafter(policy, fused: bool, seed: int):
    if fused:
        return random_fused_drafter(policy.config, (0,), seed)
    torch.manual_seed(seed)
    drafter = EagleDrafter(policy.config).eval()
    with torch.no_grad():  # biases and the norm away from their plain initial values
        for name, param in drafter.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.5)
    return drafter


def _forward_inputs(rng: random.Random, drafter, rows: int, queries: int, dtype: torch.dtype):
    """Two one-layer caches over one shuffled page table holding the same entries (PyTorch's backend, the
    kernel's), and a forward's inputs: ragged rows, `queries` new entries per row under a random tree mask, some
    queries padding."""
    config = drafter.config
    page_size = rng.choice([1, 4, 16])
    lengths = [rng.randint(1, 120) for _ in range(rows)]
    width = max(lengths) + queries + 1
    columns = math.ceil(width / page_size)
    table = PageTable(rows, width, page_size, num_pages=rows * columns + 2, scratch_len=page_size)
    pages = torch.randperm(rows * columns + 2)[: rows * columns].view(rows, columns)
    table.map([r for r in range(rows) for _ in range(columns)], list(range(columns)) * rows, pages.reshape(-1).tolist())
    caches = [drafter.new_cache(rows, width, dtype, "cpu", table, b) for b in (None, PagedCpuAttention.load())]
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    for part in ("k", "v"):
        values = torch.randn(getattr(caches[0], part).shape, generator=gen, dtype=dtype)
        for cache in caches:
            getattr(cache, part).copy_(values)
    index, mask = random_tree_mask(rng, lengths, queries, width, first_key=1, link=0.7)  # key 0: never a drafter's
    tokens = torch.randint(0, config.vocab_size, (rows, queries), generator=gen)
    features = torch.randn(rows, queries, drafter.feature_size if rng.random() < 0.5 else config.hidden_size)
    return caches, tokens, features.to(dtype), index, mask


@contextlib.contextmanager
def _counting(step: CpuDrafterStep, dtype: torch.dtype):
    """Counts the kernel's calls (a list that grows by one per call) while active."""
    calls: list[int] = []
    saved = step._entry
    step._entry = {**saved, dtype: lambda *args: calls.append(1) or saved[dtype](*args)}
    try:
        yield calls
    finally:
        step._entry = saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_matches_the_drafters_pytorch_forward_on_random_forwards(step, policies, dtype):
    rng = random.Random(11 if dtype == torch.float32 else 12)
    # RoPE's angles are float32 in both (fastrl/models/rope.py), and their cos/sin may differ by a float32 ulp
    # between PyTorch's vectorised functions and the C library's: ~1e-8 of a float64 result.
    tolerance = 2e-5 if dtype == torch.float32 else 1e-7
    with _counting(step, dtype) as calls:
        for case in range(40):
            family = rng.choice(FAMILIES)
            policy = load_model(policies[family], dtype=dtype)
            drafter = _drafter(policy, fused=rng.random() < 0.5, seed=case).to(dtype)
            queries = rng.randint(1, 4) if rng.random() < 0.7 else rng.randint(5, 13)  # 5+: a catch-up
            rows = rng.randint(1, MAX_ROWS // queries)
            (sdpa, kernel), tokens, features, index, mask = _forward_inputs(rng, drafter, rows, queries, dtype)
            slots = torch.arange(rows)
            positions = index + rng.choice([0, 0, 3])  # RoPE positions need not be the cache indices
            before = len(calls)
            with torch.no_grad():
                expected = drafter(policy, tokens, features, positions, sdpa, slots, index, mask)
                got = drafter(policy, tokens, features, positions, kernel, slots, index, mask)
            assert len(calls) == before + 1  # the kernel ran this forward
            seen = mask.any(-1)  # [B,S]: padding entries' outputs are meaningless
            scale = max(1.0, expected.abs().max().item())
            assert (got - expected)[seen].abs().max().item() <= tolerance * scale
            for part in ("k", "v"):  # the same new entries stored
                mine, theirs = getattr(kernel, part), getattr(sdpa, part)
                assert (mine - theirs).abs().max().item() <= tolerance * max(1.0, theirs.abs().max().item())


def test_what_the_kernel_does_not_take_runs_in_pytorch(step, policies, tmp_path):
    rng = random.Random(5)
    make_hf_model("qwen3", seed=1).save_pretrained(tmp_path / "qwen3")
    cases = [("llama", MAX_ROWS + 1, 1, False), ("llama", 2, 3, True), ("llama", MAX_ROWS // 2, 3, False)]
    cases += [("llama", MAX_ROWS // 4, 4, False), ("qwen3", 2, 1, False), ("llama", 1, 13, False)]
    for family, rows, queries, grad in cases:
        policy = load_model(policies[family] if family in policies else tmp_path / family)
        drafter = _drafter(policy, fused=False, seed=1)
        (_, kernel), _, _, index, mask = _forward_inputs(rng, drafter, rows, queries, torch.float32)
        meta = kernel.metadata(torch.arange(rows), index, attention_mask(index, index, mask))
        takes = rows * queries <= MAX_ROWS and not grad and family != "qwen3"  # qwen3: per-head q/k norms
        with torch.set_grad_enabled(grad):
            ready = step.prepare(drafter, policy, kernel, meta)
        assert (ready is not None) == takes
        if takes:  # a plan of its own where the attention alone goes to PyTorch (13 dense new entries)
            assert ready.kernel is not None and (meta.kernel is None) == (queries > 4)


def test_the_kernel_follows_weights_changed_in_place_or_replaced(step, policies):
    rng = random.Random(9)
    policy = load_model(policies["qwen2"])
    drafter = _drafter(policy, fused=True, seed=2)
    (sdpa, kernel), tokens, features, index, mask = _forward_inputs(rng, drafter, 3, 2, torch.float32)
    slots = torch.arange(3)
    seen = mask.any(-1)
    hidden, inter = policy.config.hidden_size, policy.config.intermediate_size
    changes = [
        lambda: drafter.load_state_dict(_drafter(policy, fused=True, seed=3).state_dict()),  # in place
        lambda: setattr(drafter.layer.mlp.up_proj, "weight", torch.nn.Parameter(torch.randn(inter, hidden) / 9)),
        lambda: setattr(drafter.layer.mlp, "gate_proj", torch.nn.Linear(hidden, inter, bias=False)),  # a new module
        lambda: policy.model.embed_tokens.weight.mul_(2.0),
    ]
    with torch.no_grad():
        before = drafter(policy, tokens, features, index, kernel, slots, index, mask)
        for change in changes:
            change()
            expected = drafter(policy, tokens, features, index, sdpa, slots, index, mask)
            got = drafter(policy, tokens, features, index, kernel, slots, index, mask)
            assert (got - expected)[seen].abs().max().item() <= 2e-5 * max(1.0, expected.abs().max().item())
            assert (got - before)[seen].abs().max().item() > 1e-3  # the change moved the output
            before = got


def test_weights_the_kernel_cannot_read_run_in_pytorch(step, policies):
    rng = random.Random(12)
    policy = load_model(policies["llama"])
    for change in ("parametrised", "transposed", "float64"):
        drafter = _drafter(policy, fused=False, seed=5)
        if change == "parametrised":  # a weight computed on access, absent from the module's parameters
            torch.nn.utils.parametrizations.weight_norm(drafter.layer.mlp.gate_proj)
        elif change == "transposed":  # a weight that is a transposed view: not contiguous
            weight = drafter.layer.self_attn.o_proj.weight
            drafter.layer.self_attn.o_proj.weight = torch.nn.Parameter(weight.detach().t().contiguous().t())
        else:
            drafter.layer.self_attn.v_proj.to(torch.float64)
        (sdpa, kernel), tokens, features, index, mask = _forward_inputs(rng, drafter, 2, 1, torch.float32)
        meta = kernel.metadata(torch.arange(2), index, attention_mask(index, index, mask))
        with torch.no_grad():
            assert step.prepare(drafter, policy, kernel, meta) is None
            if change != "float64":  # PyTorch itself refuses mixed dtypes
                expected = drafter(policy, tokens, features, index, sdpa, torch.arange(2), index, mask)
                got = drafter(policy, tokens, features, index, kernel, torch.arange(2), index, mask)
                assert (got - expected).abs().max().item() <= 2e-5 * max(1.0, expected.abs().max().item())


def test_features_of_the_wrong_width_are_refused_on_both_paths(step, policies):
    rng = random.Random(4)
    policy = load_model(policies["llama"])
    for fused in (False, True):
        drafter = _drafter(policy, fused=fused, seed=4)
        caches, tokens, _, index, mask = _forward_inputs(rng, drafter, 2, 1, torch.float32)
        wrong = torch.randn(2, 1, drafter.config.hidden_size + 8)
        for cache in caches:
            with pytest.raises(ValueError, match="features must be"):
                drafter(policy, tokens, wrong, index, cache, torch.arange(2), index, mask)


@pytest.mark.parametrize("strategy", ["3_1_4", "6_1_7@0.3", "2_2_4"])
def test_engines_with_the_kernel_generate_what_plain_decoding_generates(step, policies, strategy):
    policy = load_model(policies["qwen2"], dtype=torch.float64)
    drafter = _drafter(policy, fused=strategy != "3_1_4", seed=6).to(torch.float64)
    rng = random.Random(8)
    inputs = [
        GenerateInput(
            [rng.randrange(3, 90) for _ in range(rng.randint(2, 40))],
            SamplingParams(max_new_tokens=rng.randint(4, 40), temperature=rng.choice([0.0, 0.7, 1.0]), seed=i),
        )
        for i in range(9)
    ]
    config = EngineConfig(max_batch_size=4, max_model_len=96, dtype="float64")
    plain = Engine(policy, config).generate(inputs)
    with _counting(step, torch.float64) as calls:
        engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(Strategy.parse(strategy)))
        spec = engine.generate(inputs)
    assert len(calls) > 20
    off = dataclasses.replace(config, attention_kernel=False)
    pytorch = Engine(policy, off, drafter=drafter, selector=FixedSelector(Strategy.parse(strategy))).generate(inputs)
    for a, b, c in zip(plain, spec, pytorch, strict=True):
        assert a.token_ids == b.token_ids
        assert b.accept_lengths == c.accept_lengths  # the kernel drafts what PyTorch's forward drafts
