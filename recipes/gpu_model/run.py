"""The GPU figures in one process (weights never leave the machine): train a ~0.3B Llama on the bundled task,
train its EAGLE drafter, then benchmark fastrl against itself and transformers on it, and measure round costs of
real model shapes. Writes `results.json` and prints tables.

    python recipes/gpu_model/run.py --out runs/gpu --phases sft,drafter,bs1,plain_vs_hf,long_tail,shapes
    python recipes/gpu_model/run.py --out runs/gpu --phases attention     # no model: one layer's attention

`plain_vs_hf` and `long_tail` run fastrl twice, with its Triton attention kernel (the default) and with PyTorch's
(`engine.attention_kernel=false`: each row's pages gathered per layer), side by side.

Phases read what earlier phases wrote under --work (a model and a drafter), so a later call on the same machine
can run the benchmarks alone.

    python recipes/gpu_model/run.py --out /tmp/x --work /tmp/xw --device cpu --tiny   # a smoke run of every phase

`--tiny` takes a tiny float32 model and shrinks every phase's work to a smoke size (steps, prompts, epochs, requests,
tokens, repeats; `shapes` needs CUDA and is skipped on the CPU); a flag given explicitly still wins.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes" / "bundled_model"))

from fastrl.adaptive.factory import build_selector  # noqa: E402
from fastrl.bench.cli_args import at_least, int_list, name_list, positive_float  # noqa: E402
from fastrl.bench.gpu_round_costs import ShapeCosts, measure_costs, measure_shape  # noqa: E402
from fastrl.bench.results_file import ResultsFile, open_results  # noqa: E402
from fastrl.bench.workload import left_pad  # noqa: E402
from fastrl.engine.config import EngineConfig  # noqa: E402
from fastrl.engine.engine import Engine, GenerateInput  # noqa: E402
from fastrl.models.device_sync import drain  # noqa: E402
from fastrl.rl.tasks.task import ArithChainTask  # noqa: E402
from fastrl.sampling.params import SamplingParams  # noqa: E402
from fastrl.strategy.strategy import Strategy  # noqa: E402

STRATEGIES = "3_1_4,5_1_6,7_1_8,5_4_8,6_2_12,6_4_24,8_4_32"
TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=176, tokens_per_batch=2048)
RECIPE = dict(
    hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=4, intermediate_size=2816, tokens_per_batch=32768
)
# The work flags' defaults: the GPU run's, and --tiny's smoke run of every phase (~15 s on a CPU); a flag given
# on the command line wins over both.
FULL = dict(
    sft_seconds=200.0,
    sft_steps=1600,
    drafter_prompts=2048,
    drafter_samples=1,
    drafter_epochs=6,
    drafter_ttt=3,
    drafter_shard=4096,
    repeats=3,
    long_tail=256,
    batch_sizes=[1, 8, 64, 256],
    bs1_strategies=STRATEGIES.split(","),
    bs1_prompts=6,
)
SMOKE = dict(
    sft_seconds=30.0,
    sft_steps=40,
    drafter_prompts=8,
    drafter_samples=1,
    drafter_epochs=1,
    drafter_ttt=1,
    drafter_shard=4096,
    repeats=1,
    long_tail=4,
    batch_sizes=[1, 4],
    bs1_strategies=["5_1_6"],
    bs1_prompts=1,
)
SMOKE_TOKENS = 24
"""--tiny: most new tokens a request of any phase generates (the GPU run's range from 128 to 1,024)."""


def smoke(args: argparse.Namespace, full: int, small: int) -> int:
    """A phase's fixed size: ``full`` on the GPU run, ``small`` under --tiny."""
    return small if args.tiny else full


def log(results: ResultsFile, key: str, value) -> None:
    """Record a result and rewrite results.json at once (a later failure loses nothing)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    allocated = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    value = {"value": value, "gpu_allocated_gb": allocated}
    results.record(key, value)
    print(f"== {key}: {json.dumps(value, default=str)[:2000]}", flush=True)


def phase_sft(work: Path, args: argparse.Namespace) -> dict:
    """The model, trained on the bundled task for `--sft-steps` or `--sft-seconds`, whichever ends first."""
    from sft import SFTConfig, train

    from fastrl.commands.output_guard import check_output_dir

    cfg = SFTConfig(
        out=str(work / "model"),
        **(TINY if args.tiny else RECIPE),
        chunk_examples=smoke(args, 2048, 256),
        steps=args.sft_steps,
        warmup_steps=min(50, args.sft_steps // 4),
        lr=6e-4,
        device=args.device,
        time_budget_s=args.sft_seconds,
        threads=smoke(args, 8, 1),
    )
    train(cfg, check_output_dir("--work", cfg.out, {}, overwrite=True))  # a later call trains the model again
    return json.loads((work / "model" / "training.json").read_text())


def phase_drafter(work: Path, args: argparse.Namespace) -> dict:
    """The drafter from the model's own rollouts (`train-drafter`: streamed shards, the training-time test), greedy
    and T=1 responses, `--drafter-samples` per prompt (phase 2 of issue 26: >= 1M tokens)."""
    from fastrl.commands.train_drafter import run_train_drafter
    from fastrl.commands.train_drafter_config import TrainDrafterConfig
    from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig

    cfg = TrainDrafterConfig(
        model=str(work / "model"),
        output=str(work / "drafter"),
        overwrite=True,
        num_prompts=args.drafter_prompts,
        eval_prompts=smoke(args, 64, 4),
        samples_per_prompt=args.drafter_samples,
        rollout_temperatures=[0.0, 1.0],
        epochs=args.drafter_epochs,
        gen_batch_size=256,
        shard_requests=args.drafter_shard,
        max_new_tokens=smoke(args, 1024, SMOKE_TOKENS),
        accept_strategies=["5_1_6", "8_4_32"],
        accept_requests=smoke(args, 16, 2),
        device=args.device,
        trainer=DrafterTrainerConfig(
            lr=2e-3, max_tokens_per_batch=16384, feature_noise=0.05, ttt_steps=args.drafter_ttt
        ),
    )
    report = run_train_drafter(cfg)
    return {
        "train_tokens_per_epoch": report.train_tokens,
        "train_sequences": report.train_sequences,
        "epochs": [asdict(e) for e in report.epochs],
        "accept": [asdict(a) for a in report.accept_lengths],
    }


def load(work: Path, dtype: str):
    from fastrl.models.checkpoint import load_model
    from fastrl.models.tokenizer import load_tokenizer
    from fastrl.speculative.drafter_checkpoint import load_drafter

    policy = load_model(work / "model")
    drafter = load_drafter(work / "drafter", policy)[0]
    return policy, drafter, load_tokenizer(work / "model")


def task_prompts(tokenizer, count: int, seed: int, min_size: int = 1) -> list[list[int]]:
    task, rng = ArithChainTask(), random.Random(seed)
    prompts = []
    while len(prompts) < count:
        problem = task.sample_problem(rng)
        if problem.size >= min_size:
            prompts.append(tokenizer(problem.prompt)["input_ids"])
    return prompts


def timed_generate(engine: Engine, inputs: list[GenerateInput], repeats: int) -> tuple[float, list]:
    """Median seconds of engine.generate(inputs) (the engine is built, and its graphs captured, beforehand)."""
    times, outs = [], None
    device = engine.config.device
    engine.generate(inputs[:2])  # warm-up
    for _ in range(repeats):
        drain(device)
        start = time.perf_counter()
        outs = engine.generate(inputs)
        drain(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], outs


def phase_bs1(work: Path, args: argparse.Namespace) -> dict:
    """Batch 1 at T=0 and T=1: plain, each of `--bs1-strategies`, and HF generate, with each strategy's physical
    limit (accept length x plain round / (verify + drafting)) from measured round costs."""
    dtype, device, repeats = args.dtype, args.device, args.repeats
    policy, drafter, tokenizer = load(work, dtype)
    prompts = task_prompts(tokenizer, args.bs1_prompts, seed=7, min_size=6)
    rows = {}
    graphs_memory = {}
    new_tokens = smoke(args, 512, SMOKE_TOKENS)
    for temperature in (0.0, 1.0):
        inputs = [
            GenerateInput(p, SamplingParams(max_new_tokens=new_tokens, temperature=temperature, seed=i))
            for i, p in enumerate(prompts)
        ]
        plain = Engine(policy, EngineConfig(max_batch_size=1, device=device, dtype=dtype))
        t_plain, ref = timed_generate(plain, inputs, repeats)
        tokens = sum(len(o.token_ids) for o in ref)
        rows[f"T={temperature} fastrl plain"] = {"tok_s": tokens / t_plain, "speedup": 1.0}
        context = sum(len(p) for p in prompts) // len(prompts) + 64
        drafter = drafter.to(device, next(plain.model.parameters()).dtype)
        # round costs by CUDA events (a CPU smoke run has no limits)
        measured = measure_costs(plain.model, drafter, "trained", context) if device == "cuda" else []
        costs = next((c for c in measured if c.graphs), None)
        for name in args.bs1_strategies:
            strategy = Strategy.parse(name)
            config = EngineConfig(max_batch_size=1, device=device, dtype=dtype)
            engine = Engine(policy, config, drafter=drafter, selector=build_selector(name))
            graphs_memory[name] = engine.runner.graphs.pool_bytes if engine.runner.graphs else None
            t, outs = timed_generate(engine, inputs, repeats)
            same = [o.token_ids for o in outs] == [o.token_ids for o in ref]
            rounds = engine.round_stats[-sum(len(o.accept_lengths) for o in outs) :]
            accept = sum(s.mean_accept_length for s in rounds) / max(1, len(rounds))
            limit = physical_limit(costs, strategy, accept)
            speedup = t_plain / t
            rows[f"T={temperature} fastrl {name}"] = {
                "tok_s": tokens / t,
                "speedup": speedup,
                "accept_length": accept,
                "physical_limit": limit,
                "fraction_of_limit": speedup / limit if limit else None,
                "identical_to_plain": same,
            }
        if temperature == 0.0:
            rows.update(hf_bs1(work, prompts, new_tokens, tokens / t_plain, args))
    return {"rows": rows, "graph_pool_bytes": graphs_memory, "costs_ms": asdict(costs) if costs else None}


def physical_limit(costs: ShapeCosts | None, strategy: Strategy, accept: float) -> float | None:
    """The speedup a round of `strategy` reaches at `accept` tokens a round if it cost only its kernels' time."""
    if costs is None:
        return None
    nearest = min(costs.t_verify_ms, key=lambda k: abs(k - strategy.num_draft_tokens))
    verify = costs.t_verify_ms.get(strategy.num_draft_tokens) or costs.t_verify_ms[nearest]
    return accept * costs.t_plain_ms / (verify + strategy.steps * costs.t_draft_ms)


def hf_model(work: Path, dtype: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(work / "model", dtype=getattr(torch, dtype)).to(device).eval()


def hf_bs1(work: Path, prompts, new_tokens: int, plain_tok_s: float, args: argparse.Namespace) -> dict:
    model = hf_model(work, args.dtype, args.device)
    rows = {}
    variants = [("HF generate", {})]
    if args.hf_compile:
        variants.append(("HF static cache + compile", {"cache_implementation": "static"}))
    for name, extra in variants:
        if extra:
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)

        def run(model=model, extra=extra) -> int:
            produced = 0
            for p in prompts:
                ids = torch.tensor([p], device=args.device)
                with torch.inference_mode():
                    out = model.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=new_tokens,
                        do_sample=False,
                        pad_token_id=0,
                        **extra,
                    )
                produced += out.shape[1] - len(p)
            return produced

        try:
            run()
            drain(args.device)
            start = time.perf_counter()
            produced = run()
            drain(args.device)
            tok_s = produced / (time.perf_counter() - start)
            rows[f"T=0.0 {name}"] = {"tok_s": tok_s, "speedup": tok_s / plain_tok_s}
        except Exception as err:  # report and go on: the other figures are still worth having
            rows[f"T=0.0 {name}"] = {"error": f"{type(err).__name__}: {err}"[:300]}
    return rows


def phase_plain_vs_hf(
    work: Path, dtype: str, batch_sizes: list[int], new_tokens: int, device: str, repeats: int = 3
) -> dict:
    """Plain decoding's tokens/s per batch size, fastrl with its attention kernel and with PyTorch's, against HF
    generate (`repeats` timed runs of fastrl, one of HF)."""
    policy, _, tokenizer = load(work, dtype)
    model = hf_model(work, dtype, device)
    prompts = task_prompts(tokenizer, max(batch_sizes), seed=3)
    rows = {}
    for bs in batch_sizes:
        batch = prompts[:bs]
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        seconds = {}
        for kernel in (True, False):
            config = EngineConfig(max_batch_size=bs, device=device, dtype=dtype, attention_kernel=kernel)
            seconds[kernel], _ = timed_generate(
                Engine(policy, config), [GenerateInput(p, params) for p in batch], repeats
            )
        t = seconds[True]
        ids, mask = left_pad(batch, 0)
        ids_t, mask_t = torch.tensor(ids, device=device), torch.tensor(mask, device=device)

        def hf_run(ids_t=ids_t, mask_t=mask_t) -> None:
            with torch.inference_mode():
                model.generate(
                    ids_t,
                    attention_mask=mask_t,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                )

        hf_run()
        drain(device)
        start = time.perf_counter()
        hf_run()
        drain(device)
        t_hf = time.perf_counter() - start
        rows[bs] = {
            "fastrl_tok_s": bs * new_tokens / t,
            "fastrl_pytorch_attention_tok_s": bs * new_tokens / seconds[False],
            "hf_tok_s": bs * new_tokens / t_hf,
            "ratio": t_hf / t,
            "kernel_vs_pytorch_attention": seconds[False] / t,
        }
    return rows


def phase_long_tail(work: Path, dtype: str, count: int, device: str, new_tokens: int = 1024) -> dict:
    policy, drafter, tokenizer = load(work, dtype)
    prompts = task_prompts(tokenizer, count, seed=11)
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i))
        for i, p in enumerate(prompts)
    ]
    rows, reference = {}, None
    for name, kernel in [("disable", True), ("5_1_6", True), ("bandit", True), ("disable", False), ("5_1_6", False)]:
        config = EngineConfig(max_batch_size=count, device=device, dtype=dtype, attention_kernel=kernel)
        engine = Engine(policy, config, drafter=None if name == "disable" else drafter, selector=build_selector(name))
        start = time.perf_counter()
        outs = engine.generate(inputs)
        drain(device)
        seconds = time.perf_counter() - start
        tokens = [o.token_ids for o in outs]
        reference = reference or tokens
        lengths = sorted(len(t) for t in tokens)
        rows[name if kernel else f"{name} (PyTorch attention)"] = {
            "seconds": seconds,
            "speedup": rows["disable"]["seconds"] / seconds if rows else 1.0,
            "rounds": len(engine.round_stats),
            "identical_requests": sum(a == b for a, b in zip(tokens, reference, strict=True)),
            "p50_len": lengths[len(lengths) // 2],
            "max_len": lengths[-1],
            "capture_s": engine.runner.graphs.capture_seconds if engine.runner.graphs else None,
        }
    return rows


def phase_exactness(work: Path, dtype: str, device: str, count: int = 48, new_tokens: int = 256) -> dict:
    """Speculative vs plain on the trained model (`count` prompts), every difference judged (near-tie or bug)."""
    from fastrl.exactness.compare import compare_runs

    policy, drafter, tokenizer = load(work, dtype)
    prompts = task_prompts(tokenizer, count, seed=5)
    out = {}
    for temperature in (0.0, 1.0):
        inputs = [
            GenerateInput(p, SamplingParams(max_new_tokens=new_tokens, temperature=temperature, seed=i))
            for i, p in enumerate(prompts)
        ]
        plain = Engine(policy, EngineConfig(max_batch_size=count, device=device, dtype=dtype)).generate(inputs)
        for name in ("7_1_8", "6_4_24", "bandit"):
            config = EngineConfig(max_batch_size=16, device=device, dtype=dtype)
            engine = Engine(policy, config, drafter=drafter, selector=build_selector(name))
            report = compare_runs(engine.model, inputs, plain, engine.generate(inputs))
            out[f"T={temperature} {name}"] = report.to_dict() | {"summary": report.summary()}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line with --tiny's smoke sizes filled in, every value checked before anything is built or
    written (argparse's one-line error naming the flag)."""
    from fastrl.engine.config import check_dtype
    from fastrl.engine.machine import check_device
    from fastrl.strategy.strategy import check_strategy_names

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)

    def work(
        flag: str, kind: Callable[[str], object], text: str
    ) -> None:  # a work flag: the GPU run's default, or --tiny's
        key = flag[2:].replace("-", "_")
        full, small = (",".join(map(str, d[key])) if isinstance(d[key], list) else d[key] for d in (FULL, SMOKE))
        parser.add_argument(flag, type=kind, default=None, help=f"{text} (default: {full}; with --tiny: {small})")

    parser.add_argument("--out", default="runs/gpu")
    parser.add_argument("--work", default="/tmp/fastrl-gpu")
    parser.add_argument(
        "--phases",
        type=name_list(PHASES),
        default="sft,drafter,bs1,plain_vs_hf,long_tail,shapes",
        help=f"comma-separated, of {', '.join(PHASES)}",
    )
    work("--sft-seconds", positive_float, "the SFT phase's time budget")
    work("--sft-steps", at_least(1), "SFT steps (its schedule's length)")
    work("--drafter-prompts", at_least(1), "prompts the drafter's rollouts take")
    work("--drafter-samples", at_least(1), "responses per prompt and temperature")
    work("--drafter-epochs", at_least(1), "drafter training epochs")
    work("--drafter-ttt", at_least(1), "training-time-test steps")
    work("--drafter-shard", at_least(1), "requests generated and trained at a time")
    parser.add_argument("--hf-compile", action="store_true", help="also time HF generate with static cache + compile")
    parser.add_argument("--dtype", default=None, help="the benchmarks' dtype (default: bfloat16; with --tiny: float32)")
    work("--repeats", at_least(1), "timed repeats (medians)")
    work("--long-tail", at_least(1), "requests in the long-tail batch")
    work("--batch-sizes", int_list(1), "batch sizes plain_vs_hf times")
    work("--bs1-strategies", lambda text: text.split(","), "strategies the bs1 phase times (comma-separated)")
    work("--bs1-prompts", at_least(1), "prompts the bs1 phase generates one at a time")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu needs --tiny to be quick")
    parser.add_argument("--tiny", action="store_true", help="a tiny float32 model and smoke sizes: a smoke run")
    args = parser.parse_args(argv)
    for key, value in (SMOKE if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.dtype is None:
        args.dtype = "float32" if args.tiny else "bfloat16"
    try:
        check_device("--device", args.device)
        check_dtype("--dtype", args.dtype)
        check_strategy_names("--bs1-strategies", args.bs1_strategies)
    except ValueError as err:
        parser.error(str(err))
    return args


def main(argv: list[str] | None = None) -> None:
    """Every phase of ``--phases`` in turn, each one's result (or error) written to results.json as it ends."""
    args = parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    results = open_results(out, work, {"device": device, "torch": torch.__version__, "tiny": args.tiny})
    for phase in args.phases:
        start = time.perf_counter()
        print(f"phase {phase}", flush=True)
        try:
            value = PHASES[phase](work, out, args)
        except (Exception, SystemExit) as err:  # record it and go on: a later phase may not need this one (a
            # benchmark's own argparse refusal is a SystemExit)
            traceback.print_exc()
            value = {"error": f"{type(err).__name__}: {err}"[:2000]}
        value = {"seconds": time.perf_counter() - start} | (value if isinstance(value, dict) else {"result": value})
        log(results, phase, value)
        print(f"phase {phase} took {time.perf_counter() - start:.0f}s", flush=True)


def phase_attention(out: Path, device: str, repeats: int = 30) -> dict:
    """One layer's attention (`fastrl.bench.attention`, its default 30 repeats on the GPU run)."""
    from fastrl.bench.attention import main as attention_bench

    (out / "attention.json").unlink(missing_ok=True)  # this phase's own file, of an earlier call on this machine
    attention_bench(["--device", device, "--repeats", str(repeats), "--json", str(out / "attention.json")])
    return json.loads((out / "attention.json").read_text())


def phase_shapes(device: str) -> dict:
    """Round costs of real model shapes with random weights (CUDA events: skipped on the CPU)."""
    if device != "cuda":
        return {"skipped": "measures CUDA round costs (--device cuda)"}
    return {
        name: [asdict(r) | {"ratios": r.ratios()} for r in measure_shape(name)]
        for name in ("qwen2.5-1.5b", "qwen2.5-7b")
    }


# each phase from (work, out, args)
PHASES = {
    "sft": lambda work, out, a: phase_sft(work, a),
    "drafter": lambda work, out, a: phase_drafter(work, a),
    "bs1": lambda work, out, a: phase_bs1(work, a),
    "plain_vs_hf": lambda work, out, a: phase_plain_vs_hf(
        work, a.dtype, a.batch_sizes, smoke(a, 128, SMOKE_TOKENS), a.device, smoke(a, 3, 1)
    ),
    "long_tail": lambda work, out, a: phase_long_tail(
        work, a.dtype, a.long_tail, a.device, smoke(a, 1024, SMOKE_TOKENS)
    ),
    "attention": lambda work, out, a: phase_attention(out, a.device, smoke(a, 30, 2)),
    "exactness": lambda work, out, a: phase_exactness(
        work, a.dtype, a.device, smoke(a, 48, 4), smoke(a, 256, SMOKE_TOKENS)
    ),
    "shapes": lambda work, out, a: phase_shapes(a.device),
}

if __name__ == "__main__":
    main()
