"""The decoder layer's Triton kernels (norm, residual add + norm, RoPE, SiLU-times-up) against the eager ops on
random shapes, a model forward and an engine using them, and training untouched: compiled on a GPU where there is
one, else in Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET)."""

from __future__ import annotations

import copy
import pickle
import random

import pytest
import torch
import torch.nn.functional as F

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.layer_kernels import LayerKernels
from fastrl.models.layers import MLP, Attention, RMSNorm, install_layer_kernels
from fastrl.models.rope import apply_rope
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import Strategy
from tests.helpers import make_hf_model, triton_or_skip

triton_or_skip()
GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def kernels() -> LayerKernels:
    return LayerKernels()


def _ulps(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference in ulps of the dtype, relative to the value (absolute below 1)."""
    scale = want.float().abs().clamp_min(1.0) * torch.finfo(want.dtype).eps
    return ((got.float() - want.float()).abs() / scale).max().item()


def _rounded_as_the_kernels_round(dtype: torch.dtype):
    """The cast to `dtype` that the kernels' float32 values go through: PyTorch's (round to nearest even) when
    compiled; Triton's interpreter rounds float32 to bfloat16 toward zero, so there bfloat16 is truncated."""
    if dtype != torch.bfloat16 or GPU:
        return lambda t: t.to(dtype)
    return lambda t: (t.float().view(torch.int32) & -65536).view(torch.float32).to(dtype)


def _reference_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rope`'s arithmetic, each product and the sum cast as the kernels cast them (PyTorch's eager ops when
    compiled).  # [B,S,h,hd] -> [B,S,h,hd]"""
    if GPU or x.dtype != torch.bfloat16:
        return apply_rope(x, cos, sin)
    cast, half = _rounded_as_the_kernels_round(x.dtype), x.shape[-1] // 2
    x1, x2, c, s = x[..., :half].float(), x[..., half:].float(), cos.float(), sin.float()
    o1 = cast(cast(x1 * c[..., :half]).float() + cast(-x2 * s[..., :half]).float())
    o2 = cast(cast(x2 * c[..., half:]).float() + cast(x1 * s[..., half:]).float())
    return torch.cat((o1, o2), -1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_kernel_equals_the_eager_ops_on_random_shapes(kernels, dtype):
    """20 seeded draws of rows, widths (powers of two and not), heads and head sizes: the residual add and RoPE
    bitwise the eager ops' (in Triton's interpreter bfloat16 as it rounds), the norm and SiLU-times-up within 4
    ulps; inputs at three scales."""
    rng = random.Random(hash(str(dtype)) % 1000)
    for _ in range(20):
        rows, width = rng.randint(1, 9), rng.choice([8, 48, 64, 100, 576, 1024])
        scale = rng.choice([1e-3, 1.0, 30.0])
        gen = torch.Generator().manual_seed(rng.randrange(2**31))

        def rand(*shape: int, s: float = scale, g: torch.Generator = gen) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * s).to(DEVICE, dtype)

        x, residual, weight = rand(2, rows, width), rand(2, rows, width), rand(width, s=1.0)
        norm = RMSNorm(width, 1e-5).to(DEVICE, dtype)
        norm.weight.data.copy_(weight)
        with torch.no_grad():
            want_total = x + residual
            want = norm(want_total)
            total, got = kernels.add_rms_norm(x, residual, weight, 1e-5)
            assert torch.equal(total, _rounded_as_the_kernels_round(dtype)(x.float() + residual.float()))
            assert _ulps(got, want) <= 4.0, (rows, width, scale)
            assert _ulps(kernels.rms_norm(want_total, weight, 1e-5), want) <= 4.0

        heads, dim = rng.choice([(1, 8), (3, 16), (4, 64), (14, 64), (9, 128)])
        q = rand(2, rows, heads, dim)
        positions = torch.randint(0, 5000, (2, rows, 1, 1), generator=gen).float()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        angle = torch.cat((positions * inv, positions * inv), -1)
        cos, sin = angle.cos().to(DEVICE, dtype), angle.sin().to(DEVICE, dtype)
        assert torch.equal(kernels.rope(q, cos, sin), _reference_rope(q, cos, sin))

        gate, up = rand(rows, 3 * width), rand(rows, 3 * width)
        assert _ulps(kernels.silu_mul(gate, up), F.silu(gate) * up) <= 4.0


def test_applies_only_where_the_kernels_can_take_the_call(kernels):
    """No gradient wanted, one dtype they handle, contiguous: anything else goes to PyTorch."""
    x = torch.randn(3, 8, device=DEVICE)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    assert not LayerKernels.applies(x, w)  # a gradient is wanted
    with torch.no_grad():
        assert LayerKernels.applies(x, w)
        assert not LayerKernels.applies(x.t(), w)  # not contiguous
        assert not LayerKernels.applies(x.double(), w.double())  # float64 stays on PyTorch
        assert not LayerKernels.applies(x.half(), w)  # mixed dtypes


def test_a_model_forward_with_the_kernels_matches_and_training_keeps_autograd(kernels):
    """A 2-layer Llama with the kernels installed: the same logits as without to float32 rounding (no gradient);
    with gradients on, every module runs PyTorch's ops and the gradients are those of the model without kernels.
    A model holding them deep-copies and pickles (the kernels are rebuilt)."""
    model = load_model_from_hf()
    plain = copy.deepcopy(model)
    install_layer_kernels(model, kernels)
    ids = torch.randint(3, 90, (2, 11), device=DEVICE)
    positions = torch.arange(11, device=DEVICE).expand(2, -1)
    with torch.no_grad():
        got, want = model(ids, positions).logits, plain(ids, positions).logits
    assert (got - want).abs().max().item() < 1e-4

    for m in (model, plain):
        m.train()
        m(ids, positions).logits.float().logsumexp(-1).sum().backward()
    for (name, a), (_, b) in zip(model.named_parameters(), plain.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name

    copied = copy.deepcopy(model)
    again = pickle.loads(pickle.dumps(model))
    assert all(isinstance(m.kernels, LayerKernels) for m in (copied, again) for m in m.modules() if _holds(m))


def _holds(module) -> bool:
    return isinstance(module, (RMSNorm, MLP, Attention))


def load_model_from_hf():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        make_hf_model("llama", seed=3).save_pretrained(tmp)
        return load_model(tmp, dtype=torch.float32).to(DEVICE)


def test_speculative_rounds_with_the_kernels_equal_plain_decoding_with_them(kernels):
    """An engine whose policy and drafter run the layer kernels: the speculative rollout of a chain, a tree and a
    stopping chain is the plain one token for token (greedy and T=1 rows, seeded), log-probs to float32 rounding;
    the kernels did run."""
    model = load_model_from_hf()
    torch.manual_seed(1)
    drafter = EagleDrafter(model.config).to(DEVICE)
    rng = random.Random(5)
    inputs = [
        GenerateInput(
            [rng.randrange(3, 90) for _ in range(rng.randint(2, 20))],
            SamplingParams(max_new_tokens=rng.randint(5, 8), temperature=temperature, seed=i),
        )
        for i, temperature in enumerate((0.0, 1.0, 1.0))
    ]
    calls: list[int] = []
    counted = _Counting(kernels, calls)
    outputs = {}
    for name in ("disable", "3_1_4", "2_2_4", "5_1_6@0.4"):
        config = EngineConfig(3, 64, DEVICE, "float32", cuda_graphs=False, layer_kernels=True)
        selector = FixedSelector(Strategy.parse(name))
        engine = Engine(model, config, drafter=None if name == "disable" else drafter, selector=selector)
        # after the engine: on a GPU it installs its own (uncounted) kernels on the modules it runs
        install_layer_kernels(model, counted)
        install_layer_kernels(drafter, counted)
        outputs[name] = engine.generate(inputs)
    assert len(calls) > 50
    for name, rollout in outputs.items():
        for spec, plain in zip(rollout, outputs["disable"], strict=True):
            assert spec.token_ids == plain.token_ids, name
            assert max(abs(a - b) for a, b in zip(spec.logprobs, plain.logprobs, strict=True)) < 1e-4


class _Counting(LayerKernels):
    """The kernels, counting calls (a subclass: the engine's modules hold it as they hold the real one)."""

    def __init__(self, inner: LayerKernels, calls: list[int]) -> None:
        self.__dict__.update(inner.__dict__)
        self.calls = calls

    def rms_norm(self, *args):
        self.calls.append(1)
        return super().rms_norm(*args)

    def rope(self, *args):
        self.calls.append(1)
        return super().rope(*args)


@pytest.mark.gpu
def test_a_gpu_engine_installs_them_and_takes_them_out():
    """On a GPU the engine gives its modules the kernels (`layer_kernels=True`, the default) or PyTorch's ops."""
    model = load_model_from_hf().to(torch.bfloat16)
    for use in (True, False):
        Engine(model, EngineConfig(2, 64, "cuda", "bfloat16", cuda_graphs=False, layer_kernels=use))
        held = {type(m.kernels).__name__ for m in model.modules() if _holds(m)}
        assert held == ({"LayerKernels"} if use else {"NoneType"})


def test_load_checks_the_kernels_and_says_why_it_goes_on_without_them(caplog):
    """`load` returns kernels that passed their check; float64 (not taken) gives None silently; a failing check or a
    kernel that raises gives None and one warning naming why."""
    assert isinstance(LayerKernels.load(DEVICE, torch.float16), LayerKernels)
    assert LayerKernels.load(DEVICE, torch.float64) is None and not caplog.records

    class Wrong(LayerKernels):
        def self_check(self, device, dtype):
            return "RoPE differs"

    class Broken(LayerKernels):
        def self_check(self, device, dtype):
            raise RuntimeError("no compiler")

    for kind, why in ((Wrong, "RoPE differs"), (Broken, "RuntimeError: no compiler")):
        caplog.clear()
        assert kind.load(DEVICE, torch.float32) is None
        assert [r.getMessage() for r in caplog.records] == [
            f"the layer kernels failed the check against PyTorch ({why}): the layers run PyTorch's ops"
        ]


def test_broadcast_angles_and_mismatched_residuals_go_to_pytorch(kernels):
    """RoPE angles shared across rows ([1,S,1,hd] for x [B,S,h,hd]) and a residual of another shape are PyTorch's
    (the kernels index one angle row per token and one residual row per row)."""
    attention = Attention(load_model_from_hf().config, 0).to(DEVICE)
    attention.kernels = kernels
    x = torch.randn(3, 5, 4, attention.head_dim, device=DEVICE)
    angle = torch.rand(1, 5, 1, attention.head_dim, device=DEVICE)
    with torch.no_grad():
        assert torch.equal(attention._rope(x, angle.cos(), angle.sin()), apply_rope(x, angle.cos(), angle.sin()))
        norm = RMSNorm(8, 1e-6).to(DEVICE)
        norm.kernels = kernels
        h, r = torch.randn(2, 3, 8, device=DEVICE), torch.randn(1, 3, 8, device=DEVICE)
        total, normed = norm.add_norm(h, r)
        assert torch.equal(total, h + r) and normed.shape == (2, 3, 8)
