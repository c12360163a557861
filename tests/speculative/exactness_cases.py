"""Seeded random exactness cases: a model, a strategy, a batch size, requests with mixed sampling settings that
arrive while others decode; each case decodes plainly and speculatively and the two runs are compared.

A case is a pure function of its seed (print the seed of a failing case to replay it with `make_case(seed)`).
Engines compute in float64, where the rounding difference between a plain row and a verify row (~1e-16) cannot
separate two perturbed logits, so any mismatch is a bug: `compare_runs` still judges it and reports the gap.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass
from functools import cache

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.request import RequestOutput
from fastrl.exactness.compare import ExactnessReport, compare_runs
from fastrl.models.checkpoint import load_model
from fastrl.models.decoder import CausalLM
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.selector import StrategySelector
from fastrl.strategy.strategy import DISABLE, Strategy, max_tree_tokens
from tests.helpers import FLOAT64_LOGPROB_TOL, make_hf_model
from tests.speculative.fused_helpers import random_fused_drafter

RANDOM_FAMILIES = ("llama", "qwen2", "qwen3")  # Llama GQA, Qwen2 bias + untied, Qwen3 qk-norm + tied
MODELS = (*RANDOM_FAMILIES, "bundled")
TOP_K_CHOICES = (1, 2, 3, 7, 50)
DTYPE = "float64"
# Log-prob tolerance per engine dtype: float64 rounding only; float32 plain and verify rows differ by ~2e-5 in
# logits, ~1e-4 in scaled logits at T = 0.2 (the long float32 profile saw 8.7e-5), so float32 allows 1e-3. A subtle
# bug hides below that in float32: the float64 profile is the strict one.
LOGPROB_TOLS = {"float64": FLOAT64_LOGPROB_TOL, "float32": 1e-3}


@dataclass
class Case:
    """One exactness case. arrivals[i]: the engine step at which request i is added."""

    seed: int
    model: str
    strategy: Strategy
    batch_size: int
    plain_batch_size: int
    inputs: list[GenerateInput]
    arrivals: list[int]
    draft_vocab: tuple[int, ...] | None = None
    switch_space: tuple[Strategy, ...] = ()  # non-empty: a seeded selector switches among these every round
    dtype: str = DTYPE  # the engines' dtype (float32: differences may be near-ties, judged by their gap)
    fused: tuple[int, ...] = ()  # non-empty: a fused drafter (EAGLE-3 input) reading these layers, random fuse

    def selector(self) -> StrategySelector:
        """The speculative run's selector: the case's one strategy, or a seeded switch over its space."""
        if self.switch_space:
            return SwitchingSelector(self.switch_space, seed=self.seed)
        return FixedSelector(self.strategy)

    def describe(self) -> str:
        settings = sorted({_settings(i.params) for i in self.inputs})
        return (
            f"case seed={self.seed} model={self.model} strategy={self.strategy} "
            f"switch_space={[str(x) for x in self.switch_space]} bs={self.batch_size} "
            f"plain_bs={self.plain_batch_size} requests={len(self.inputs)} settings={settings} "
            f"draft_vocab={None if self.draft_vocab is None else len(self.draft_vocab)} dtype={self.dtype} "
            f"fused={list(self.fused)}"
        )


class SwitchingSelector:
    """A seeded selector that draws any strategy of its space each round (``disable`` included when given): every
    switch between EAGLE, history, hybrid and plain rounds must leave the tokens unchanged."""

    def __init__(self, space: tuple[Strategy, ...], seed: int) -> None:
        self._space = list(space)
        self._rng = random.Random(seed)

    @property
    def strategies(self) -> list[Strategy]:
        return list(self._space)

    def choose(self, batch_size: int) -> Strategy:
        return self._rng.choice(self._space)

    def observe(self, stats: RoundStats) -> None:
        """Learns nothing."""

    def state_dict(self) -> dict:
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self._rng.setstate(state["rng"])


SHAPE_PREFIX = "shape:"  # a model name "shape:SEED": a random architecture drawn from SEED (see ``random_shape``)


def random_shape(seed: int) -> tuple[str, dict, int]:
    """A random family (Llama untied or tied, Qwen2, Qwen3), its sizes and vocabulary from ``seed``: 1-3 layers,
    head size 8-128 (odd multiples of 4 and 8 included), 1-4 KV heads with 1-4 query heads each, vocabulary
    11-5000. The suite's other models all have head size 16 or 32 and 4:2 or 6:2 heads; kernels with per-shape
    instances and fallbacks (the CPU attention, the drafter step) meet other shapes here."""
    rng = random.Random(seed * 31 + 7)
    family = rng.choice(["llama", "llama_tied", "qwen2", "qwen3"])
    kv = rng.choice([1, 2, 3, 4])
    heads = kv * rng.choice([1, 2, 3, 4])
    sizes = dict(
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=rng.choice([8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 128]),
        hidden_size=heads * rng.choice([4, 8, 16, 32]),
        intermediate_size=rng.choice([40, 64, 128, 200]),
        num_hidden_layers=rng.randint(1, 3),
    )
    return family, sizes, rng.choice([11, 50, 97, 300, 1200, 5000])


def models(name: str, dtype: str = DTYPE) -> tuple[CausalLM, EagleDrafter]:
    """The policy and a drafter in `dtype` for a model name: random families get a fresh seeded drafter, the
    bundled model its shipped one, a ``shape:SEED`` model a random architecture (the last few kept). Cached per
    dtype: engines never change weights, and one of this dtype never converts them."""
    if name.startswith(SHAPE_PREFIX):
        return _shape_models(name, dtype)
    return _family_models(name, dtype)


@functools.lru_cache(maxsize=4)
def _shape_models(name: str, dtype: str) -> tuple[CausalLM, EagleDrafter]:
    import tempfile

    seed = int(name.removeprefix(SHAPE_PREFIX))
    family, sizes, vocab = random_shape(seed)
    with tempfile.TemporaryDirectory() as tmp:
        make_hf_model(family, seed=seed, vocab_size=vocab, **sizes).save_pretrained(tmp)
        policy = load_model(tmp)
    torch.manual_seed(seed)
    drafter = EagleDrafter(policy.config)
    torch_dtype = getattr(torch, dtype)
    return policy.to(torch_dtype).eval(), drafter.to(torch_dtype).eval()


@cache
def _family_models(name: str, dtype: str) -> tuple[CausalLM, EagleDrafter]:
    if name == "bundled":
        policy = load_model(bundled_model_dir())
        drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            make_hf_model(name, seed=11, max_positions=256).save_pretrained(tmp)
            policy = load_model(tmp)
        torch.manual_seed(5)
        drafter = EagleDrafter(policy.config)
    torch_dtype = getattr(torch, dtype)
    return policy.to(torch_dtype).eval(), drafter.to(torch_dtype).eval()


@cache
def fused_drafter(name: str, layers: tuple[int, ...], dtype: str = DTYPE) -> FusedEagleDrafter:
    """A fused drafter over `layers` with the model's drafter weights (the shipped one for the bundled model) and
    random fuse weights (seeded by the layers), in `dtype`."""
    policy, base = models(name, dtype)
    drafter = random_fused_drafter(policy.config, layers, seed=sum(layers) + 31)
    drafter.load_state_dict({**base.state_dict(), "fuse.weight": drafter.fuse.weight}, strict=True)
    return drafter.to(getattr(torch, dtype)).eval()


def random_strategy(rng: random.Random, vocab: int) -> Strategy:
    """Any strategy the grammar allows: EAGLE (steps 1-8, topk 1-8, every valid num_draft_tokens up to 64), history
    (suffix_2 .. suffix_32) and their hybrids; chains with a confidence stop (`S_1_N@P`) among the chains."""
    kind = rng.choices(["eagle", "history", "hybrid"], weights=[3, 1, 1])[0]
    history = rng.randint(2, 32) if kind != "eagle" else 0
    if kind == "history":
        return Strategy(0, 0, 0, history_nodes=history)
    steps = rng.randint(1, 8)
    topk = rng.randint(1, min(8, vocab))
    if topk == 1:
        return Strategy(steps, 1, steps + 1, history_nodes=history, stop_below=_chain_stop(rng))
    return Strategy(steps, topk, rng.randint(2, min(64, max_tree_tokens(steps, topk))), history_nodes=history)


def _chain_stop(rng: random.Random) -> float:
    """A chain's confidence stop, 0 (none) in about half the chains, drawn from a generator seeded by `rng`'s state
    without advancing it, so every other draw of a case (and the cases of earlier seeds) stays as it was."""
    sub = random.Random(hash(rng.getstate()))
    if sub.random() < 0.5:
        return 0.0
    return sub.choice([sub.uniform(0.05, 0.95), sub.uniform(0.3, 0.6), 1e-6, 0.999])


def random_params(rng: random.Random, max_new_tokens: int, vocab: int) -> SamplingParams:
    """Greedy, temperature, top-k, top-p and their combinations; random stop tokens and EOS handling."""
    kind = rng.choice(["greedy", "temp", "top_k", "top_p", "top_k+top_p", "greedy+filters"])
    temperature = 0.0 if kind.startswith("greedy") else rng.uniform(0.2, 1.5)
    top_k = rng.choice(TOP_K_CHOICES) if "top_k" in kind or kind == "greedy+filters" else 0
    top_p = rng.uniform(0.2, 1.0) if "top_p" in kind or kind == "greedy+filters" else 1.0
    stop = tuple(rng.sample(range(3, vocab), rng.choice([0, 0, 1, 2])))
    return SamplingParams(
        max_new_tokens=rng.randint(1, max_new_tokens),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=rng.getrandbits(63),
        stop_token_ids=stop,
        ignore_eos=rng.random() < 0.3,
    )


def make_case(
    seed: int, max_new_tokens: int = 48, max_batch: int = 16, dtype: str = DTYPE, shapes: bool = False
) -> Case:
    """The case of `seed`: model, strategy, batch sizes, requests and arrival steps all drawn from it; its engines
    compute in `dtype`; with `shapes`, the model is a random architecture (``random_shape``) instead of one of
    ``MODELS`` (every other draw as without it)."""
    rng = random.Random(seed)
    name = f"{SHAPE_PREFIX}{seed}" if shapes else MODELS[seed % len(MODELS)]
    policy, _ = models(name)
    vocab = policy.config.vocab_size
    batch_size = rng.randint(1, max_batch)
    count = rng.randint(1, batch_size + 4)
    inputs = []
    prompts: list[list[int]] = []
    for i in range(count):
        if prompts and rng.random() < 0.4:  # a GRPO sibling: an earlier prompt again, with its own sampling
            prompt = list(rng.choice(prompts))
        elif name == "bundled":
            problem = ArithChainTask().sample_problem(rng)
            prompt = _bundled_tokenizer()(problem.prompt)["input_ids"]
        else:
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 20))]
        prompts.append(prompt)
        inputs.append(GenerateInput(prompt, random_params(rng, max_new_tokens, vocab), request_id=f"c{seed}-{i}"))
    arrivals = [0 if rng.random() < 0.6 else rng.randint(1, 12) for _ in inputs]
    strategy = random_strategy(rng, vocab)
    switch_space: tuple[Strategy, ...] = ()
    if rng.random() < 0.3:  # switch every round among 2-4 strategies, plain rounds sometimes among them
        others = [random_strategy(rng, vocab) for _ in range(rng.randint(1, 3))]
        switch_space = tuple(dict.fromkeys([strategy, *others, *([DISABLE] if rng.random() < 0.5 else [])]))
    draft_vocab = None
    if rng.random() < 0.35:  # a reduced draft vocabulary: any subset at least as wide as every topk
        widest = max(s.topk for s in (strategy, *switch_space))
        size = rng.randint(max(widest, 1), vocab)
        draft_vocab = tuple(sorted(rng.sample(range(vocab), size)))
    plain_batch_size = rng.randint(1, max_batch)
    fused: tuple[int, ...] = ()
    if rng.random() < 0.3:  # drawn last: the earlier draws of a seed stay what they were before fused drafters
        layers = policy.config.num_hidden_layers
        fused = tuple(sorted(rng.sample(range(layers), rng.randint(1, min(2, layers)))))
    return Case(
        seed, name, strategy, batch_size, plain_batch_size, inputs, arrivals, draft_vocab, switch_space, dtype, fused
    )


def pressure(case: Case) -> dict:
    """Engine keys that put the case's speculative run under memory pressure, drawn from its seed: a page size of
    1-32, a KV pool of 5-100% of the tokens its requests need (at least one request's context plus a speculative
    round, the least an engine takes), the context cut to the longest request, prefix sharing on or off, admission
    in batches of 1 to the batch size, a drafter backlog of a round to 40 entries (or the default). The engine
    must wait or preempt and recompute, and still decode exactly what plain decoding does."""
    rng = random.Random(case.seed * 7 + 1)
    longest = max(len(i.prompt_ids) + i.params.max_new_tokens for i in case.inputs)
    context = longest + rng.choice([0, 1, 5, 40])
    needed = sum(len(i.prompt_ids) + i.params.max_new_tokens for i in case.inputs)
    fraction = rng.choice([0.05, 0.1, 0.2, 0.4, 1.0])
    return {
        "page_size": rng.choice([1, 2, 3, 4, 8, 16, 32]),
        "kv_cache_tokens": max(int(needed * fraction), context + 64),
        "max_model_len": context,
        "prefix_sharing": rng.random() < 0.7,
        "admit_batch": rng.randint(1, case.batch_size),  # drawn after the keys above: they stay what they were
        "drafter_backlog": rng.choice([None, 1, 3, 8, 40]),  # drawn last: the drafter reads long plain stretches early
    }


def decode(
    case: Case,
    selector: StrategySelector,
    batch_size: int,
    arrivals: list[int],
    engine_keys: dict | None = None,
    counts: Counter[str] | None = None,
) -> list[RequestOutput]:
    """Run the case's requests through one engine (`engine_keys`: more EngineConfig keys), adding request i at step
    arrivals[i]; outputs in input order. `counts` gains the engine's preemptions."""
    policy, drafter = models(case.model, case.dtype)
    if case.fused:
        drafter = fused_drafter(case.model, case.fused, case.dtype)
    speculative = any(s.uses_drafter for s in selector.strategies)
    drafter.set_draft_vocab(None if case.draft_vocab is None else torch.tensor(case.draft_vocab))
    engine = Engine(
        policy,
        EngineConfig(max_batch_size=batch_size, dtype=case.dtype, **(engine_keys or {})),
        drafter=drafter if speculative else None,
        selector=selector,
    )
    order = sorted(range(len(case.inputs)), key=lambda i: arrivals[i])
    done: dict[str, RequestOutput] = {}
    step = 0
    while order or engine.has_unfinished():
        while order and arrivals[order[0]] <= step:
            inp = case.inputs[order.pop(0)]
            engine.add_request(inp.prompt_ids, inp.params, inp.request_id)
        done.update({out.request_id: out for out in engine.step() if out.finished})
        step += 1
    if counts is not None:
        counts["preemptions"] += engine.scheduler.preemptions
    return [done[i.request_id] for i in case.inputs]


def run_case(case: Case, under_pressure: bool = False, counts: Counter[str] | None = None) -> ExactnessReport:
    """Plain decoding (all requests at once, its own batch size) against the case's speculative run (with
    `under_pressure`, in an engine of the case's `pressure` keys; `counts` gains its preemptions)."""
    plain = decode(case, FixedSelector(DISABLE), case.plain_batch_size, [0] * len(case.inputs))
    keys = pressure(case) if under_pressure else None
    spec = decode(case, case.selector(), case.batch_size, case.arrivals, keys, counts)
    policy = models(case.model, case.dtype)[0]
    return compare_runs(policy, case.inputs, plain, spec, logprob_tol=LOGPROB_TOLS[case.dtype])


@cache
def _bundled_tokenizer():
    return load_tokenizer(bundled_model_dir())


def _settings(p: SamplingParams) -> str:
    return f"T={p.temperature:.2f},k={p.top_k},p={p.top_p:.2f}"
