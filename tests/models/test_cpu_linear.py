"""The small-row linear kernel: PyTorch's product to rounding, each row's bits independent of the other rows, used
exactly where `SmallLinear.applies` says, and engines using it generate plain decoding's tokens."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.cpu_linear import MAX_ROWS, MIN_ROWS, MIN_WEIGHT, Linear, small_linear
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import Strategy
from tests.helpers import make_hf_model

KERNEL = small_linear()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no C++ compiler to build the kernel")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        return KERNEL(x, weight, bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_matches_pytorch_on_random_shapes(dtype):
    rng = random.Random(7)
    for _ in range(30):
        rows, k, n = rng.randint(1, 40), rng.randint(1, 300), rng.randint(1, 200)
        weight = torch.randn(n, k, dtype=dtype)
        bias = torch.randn(n, dtype=dtype) if rng.random() < 0.5 else None
        lead = rng.choice([(rows,), (1, rows), (rows, 1)])
        x = torch.randn(*lead, k, dtype=dtype)
        if rng.random() < 0.3:  # rows with a stride: a slice of wider rows
            x = torch.randn(*lead, k + 5, dtype=dtype)[..., 2 : 2 + k]
        got, want = _product(x, weight, bias), F.linear(x, weight, bias)
        tolerance = 1e-12 if dtype == torch.float64 else 2e-5
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * k**0.5)


def test_a_rows_result_does_not_depend_on_the_other_rows():
    rng = torch.Generator().manual_seed(3)
    weight = torch.randn(97, 131, generator=rng)
    bias = torch.randn(97, generator=rng)
    x = torch.randn(37, 131, generator=rng)
    full = _product(x, weight, bias)
    for first, count in [(0, 1), (5, 2), (3, 7), (16, 16), (30, 7), (0, 37)]:
        part = _product(x[first : first + count], weight, bias)
        assert torch.equal(part, full[first : first + count]), (first, count)


def test_the_kernel_runs_only_where_it_applies():
    weight = torch.randn(MIN_WEIGHT // 256, 256)
    small = torch.randn(MIN_WEIGHT // 256 - 1, 256)
    assert weight.numel() == MIN_WEIGHT and small.numel() < MIN_WEIGHT
    with torch.no_grad():
        for rows in range(1, MAX_ROWS + 3):
            x = torch.randn(rows, 256)
            assert KERNEL.applies(x, weight) == (MIN_ROWS <= rows <= MAX_ROWS), rows
            assert not KERNEL.applies(x, small)
            assert not KERNEL.applies(x.double(), weight)  # dtypes differ
        x = torch.randn(2, 2, 256)  # 4 rows over two axes
        assert KERNEL.applies(x, weight)
        assert not KERNEL.applies(x.to(torch.bfloat16), weight.to(torch.bfloat16))
        assert not KERNEL.applies(x, weight.t().contiguous().t())  # not contiguous
        assert not KERNEL.applies(torch.randn(4, 512), weight)  # a width the weight does not take
        with pytest.raises(RuntimeError):  # PyTorch's product, which names the mismatch
            Linear(256, MIN_WEIGHT // 256)(torch.randn(4, 512))
        torch.set_num_threads(2)
        assert not KERNEL.applies(x, weight)
        torch.set_num_threads(1)
    trained = torch.nn.Parameter(weight.clone())
    assert not KERNEL.applies(x, trained)  # a gradient is wanted
    with torch.no_grad():
        assert KERNEL.applies(x, trained)


def test_linear_sends_its_forwards_to_the_kernel_and_keeps_autograd_elsewhere():
    layer = Linear(256, MIN_WEIGHT // 256)
    x = torch.randn(1, 4, 256)
    before = KERNEL.calls
    with torch.no_grad():
        out = layer(x)
    assert KERNEL.calls == before + 1
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=2e-5, atol=2e-4)
    loss = layer(x).sum()  # with autograd: PyTorch's product, gradients as nn.Linear's
    loss.backward()
    assert KERNEL.calls == before + 1 and layer.weight.grad is not None
    assert set(layer.state_dict()) == {"weight", "bias"}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A float64 Llama whose MLP weights and LM head (1024 x 256) take the kernel (its 256 x 256 projections do
    not), with a random drafter, and its transformers twin."""
    hf = make_hf_model("llama", seed=5, vocab_size=1024, hidden_size=256, intermediate_size=1024).double()
    path = tmp_path_factory.mktemp("wide")
    hf.save_pretrained(path)
    policy = load_model(path).to(torch.float64).eval()
    assert policy.lm_head.weight.numel() >= MIN_WEIGHT > policy.model.layers[0].self_attn.q_proj.weight.numel()
    torch.manual_seed(6)
    return hf, policy, EagleDrafter(policy.config).to(torch.float64).eval()


def _generate(wide, strategy: str, batch: int, inputs: list[GenerateInput]) -> list:
    """The outputs of a float64 engine over the `wide` model with a fixed `strategy` ('disable': plain)."""
    _, policy, drafter = wide
    engine = Engine(
        policy,
        EngineConfig(max_batch_size=batch, dtype="float64"),
        drafter=None if strategy == "disable" else drafter,
        selector=FixedSelector(Strategy.parse(strategy)),
    )
    return engine.generate(inputs)


def _inputs(greedy: bool) -> list[GenerateInput]:
    rng = random.Random(8)
    temperatures = [0.0] * 4 if greedy else [1.0, 0.7, 1.3, 0.0]
    return [
        GenerateInput(
            [rng.randrange(3, 1024) for _ in range(rng.randint(3, 14))],
            SamplingParams(max_new_tokens=20, temperature=t, seed=i, ignore_eos=True),
        )
        for i, t in enumerate(temperatures)
    ]


@pytest.mark.parametrize("strategy", ["3_1_4", "2_2_4", "6_1_7@0.3"])
def test_engines_with_the_kernel_generate_plain_decodings_tokens(wide, strategy):
    """Batch 1 and 4 (verify forwards of 4-7 rows and plain forwards of 1 and 4 rows take the kernel), sampled and
    greedy: speculative decoding gives plain decoding's tokens."""
    for batch in (1, 4):
        before = KERNEL.calls
        plains = _generate(wide, "disable", batch, _inputs(greedy=False))
        specs = _generate(wide, strategy, batch, _inputs(greedy=False))
        assert KERNEL.calls > before
        for plain, spec in zip(plains, specs, strict=True):
            assert plain.token_ids == spec.token_ids
            assert max(abs(a - b) for a, b in zip(plain.logprobs, spec.logprobs, strict=True)) < 1e-9


def test_greedy_decoding_with_the_kernel_equals_transformers(wide):
    hf = wide[0]
    inputs = _inputs(greedy=True)
    before = KERNEL.calls
    outputs = _generate(wide, "3_1_4", 4, inputs)
    assert KERNEL.calls > before
    for request, output in zip(inputs, outputs, strict=True):
        prompt = torch.tensor([request.prompt_ids])
        with torch.no_grad():
            want = hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=20,
                do_sample=False,
                min_new_tokens=20,
                pad_token_id=0,
            )
        assert output.token_ids == want[0, prompt.shape[1] :].tolist()


@pytest.mark.parametrize("seed", range(6))
def test_random_engines_with_the_kernel_equal_plain_decoding(wide, seed):
    """Seeded random cases over strategies (chains, trees, stopping chains), batch sizes and sampling settings on the
    model whose MLP and LM head take the kernel: every request's tokens equal plain decoding's."""
    rng = random.Random(1000 + seed)
    strategy = rng.choice(["3_1_4", "5_1_6", "2_2_4", "4_2_8", "3_3_9", "8_1_9@0.3", "12_1_13@0.5"])
    batch = rng.randint(1, 5)
    inputs = []
    for _ in range(rng.randint(2, 6)):
        params = SamplingParams(
            max_new_tokens=rng.randint(4, 24),
            temperature=rng.choice([0.0, 0.6, 1.0, 1.4]),
            top_k=rng.choice([0, 0, 20]),
            top_p=rng.choice([1.0, 1.0, 0.9]),
            seed=rng.randrange(10**6),
            ignore_eos=True,
        )
        inputs.append(GenerateInput([rng.randrange(3, 1024) for _ in range(rng.randint(2, 20))], params))
    before = KERNEL.calls
    plains, specs = _generate(wide, "disable", batch, inputs), _generate(wide, strategy, batch, inputs)
    assert KERNEL.calls > before, (strategy, batch)
    for plain, spec in zip(plains, specs, strict=True):
        assert plain.token_ids == spec.token_ids, (strategy, batch)
