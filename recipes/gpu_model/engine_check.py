"""The engine's GPU checks in one call, no training (issue 26, phase 1): the GPU tests, one layer's attention, plain
decoding's tokens/s with fastrl's Triton attention and with PyTorch's against transformers `generate` and against
the round's memory-bandwidth limit, a torch-profiler breakdown of one plain and one speculative round at batch
256, and the bundled model's long-tail batch (plain, static trees, the bandit). The large-batch phases use
random weights at the GPU recipe model's shape (a 316M Llama, 28 layers, hidden 1024, 16/4 heads, the bundled
task's 91-token vocabulary): decoding speed does not depend on what the weights say (EOS is ignored).

    PYTHONPATH=. python recipes/gpu_model/engine_check.py --out $OUT           # on the GPU, --deadline 520 s
    python recipes/gpu_model/engine_check.py --out /tmp/x --device cpu --tiny  # a smoke run of the same code

Every argument is checked before the model is built (a typo is argparse's one-line error, not a phase lost later).
Every phase rewrites `results.json` when it ends (a later failure loses nothing); a phase that raises is recorded
with its error and the next one runs. The tests phase runs pytest from the repository root (relative --tests paths
are the repository's), and pytest failing with no failed test (a path not found) is that phase's error.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.bench.cli_args import at_least, int_list, name_list, positive_float
from fastrl.bench.results_file import open_results
from fastrl.bench.timing import time_median
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import save_model
from fastrl.models.config import ModelConfig
from fastrl.models.decoder import CausalLM
from fastrl.models.device_sync import drain
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import Strategy

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("plain", "profile", "long_tail", "admission", "attention", "tests")
RECIPE = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=4)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # bytes/s, by device name
TESTS = [
    "tests/models/test_layer_kernels.py",
    "tests/models/test_gpu_attention.py",
    "tests/models/test_cuda.py",
    "tests/sampling/test_gumbel_noise.py",
    "tests/engine/test_cuda_graphs.py",
    "tests/engine/test_release_memory_gpu.py",
]


def build(tiny: bool, device: str, dtype: torch.dtype) -> tuple[CausalLM, EagleDrafter]:
    """The recipe's shape (or a tiny one) with random weights, and a random drafter for it."""
    shape = TINY if tiny else RECIPE
    config = ModelConfig(
        "llama",
        91,
        intermediate_size=shape["hidden_size"] * 11 // 4,
        max_position_embeddings=2048,
        eos_token_id=2,
        bos_token_id=1,
        **shape,
    )
    torch.manual_seed(0)
    model = CausalLM(config).to(device, dtype).eval()
    return model, EagleDrafter(config).to(device, dtype).eval()


def prompts(batch: int, length: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(3, 91, (batch, length), generator=gen).tolist()


def engine_for(model, drafter, batch: int, strategy: str, device: str, dtype: torch.dtype, **kernels: bool) -> Engine:
    """An engine of `batch` slots running `strategy`; `kernels`: EngineConfig's attention_kernel / layer_kernels."""
    config = EngineConfig(
        max_batch_size=batch, max_model_len=1024, device=device, dtype=str(dtype).split(".")[-1], **kernels
    )
    parsed = Strategy.parse(strategy)
    return Engine(model, config, drafter if parsed.uses_drafter else None, FixedSelector(parsed))


def bandwidth_limit_tok_s(model: CausalLM, batch: int, context: int, bytes_per_s: float) -> float:
    """Tokens/s if a plain round only read the weights and the batch's KV once at `bytes_per_s`."""
    c = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    item = next(model.parameters()).element_size()
    kv = batch * context * c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * item
    return batch / ((weights + kv) / bytes_per_s)


def phase_plain(model, args, device, dtype) -> dict:
    """Plain decoding tok/s per batch size: fastrl with its kernels, with PyTorch's attention, with PyTorch's layer
    ops (norms, RoPE, SwiGLU), and HF generate."""
    rows = {}
    hf = hf_model(model, args, device, dtype)
    for batch in args.batch_sizes:
        ids = prompts(batch, args.prompt_len)
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
        inputs = [GenerateInput(p, params) for p in ids]
        row = {}
        variants = {
            "kernel": {},
            "pytorch_attention": {"attention_kernel": False},
            "eager_layers": {"layer_kernels": False},
        }
        for name, kernels in variants.items():
            engine = engine_for(model, None, batch, "disable", device, dtype, **kernels)
            seconds = time_median(lambda e=engine, i=inputs: e.generate(i), args.repeats, device).median_s
            row[name] = batch * args.new_tokens / seconds
            del engine
        tensor = torch.tensor(ids, device=device)
        generate = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
        with torch.inference_mode():
            seconds = time_median(
                lambda t=tensor, g=generate: hf.generate(t, attention_mask=torch.ones_like(t), **g), 1, device
            ).median_s
        row["hf_generate"] = batch * args.new_tokens / seconds
        context = args.prompt_len + args.new_tokens // 2
        row["bandwidth_limit"] = bandwidth_limit_tok_s(model, batch, context, args.bandwidth)
        row["kernel_vs_pytorch_attention"] = row["kernel"] / row["pytorch_attention"]
        row["layer_kernels_vs_eager_layers"] = row["kernel"] / row["eager_layers"]
        row["kernel_vs_hf"] = row["kernel"] / row["hf_generate"]
        row["fraction_of_limit"] = row["kernel"] / row["bandwidth_limit"]
        rows[batch] = row
        print(f"plain batch {batch}: {json.dumps(row)}", flush=True)
    return rows


def hf_model(model: CausalLM, args, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    path = Path(args.work) / "random-recipe"
    save_model(model, path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def phase_profile(model, drafter, args, device, dtype) -> dict:
    """One plain and one speculative round at each of `--profile-batches`: the round's wall time (median of 3,
    outside the profiler), its device time summed over kernels, its top ops by device time under the torch profiler
    and, below them, its ops by host time grouped by the Python lines that called them."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for batch in args.profile_batches:
        rows = {}
        for strategy in ("disable", args.strategy):
            engine = engine_for(model, drafter, batch, strategy, device, dtype)
            for i, p in enumerate(prompts(batch, args.prompt_len)):
                engine.add_request(p, SamplingParams(max_new_tokens=64, temperature=1.0, ignore_eos=True, seed=i))
            for _ in range(4):  # prefill and warm rounds
                engine.step()
            # rounds at 5-9 tokens in (random drafts: nothing is accepted)
            wall = time_median(engine.step, 3, device).median_s
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
            with profile(activities=activities, with_stack=True) as prof:
                engine.step()
                drain(device)
            averages = prof.key_averages()
            key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
            table = averages.table(sort_by=key, row_limit=25)
            # where the host's time goes: ops by self CPU time, grouped by the Python lines that called them
            host = prof.key_averages(group_by_stack_n=4).table(sort_by="self_cpu_time_total", row_limit=30)
            name = f"profile_{strategy}_b{batch}.txt"
            (Path(args.out) / name).write_text(table + "\n\nBy host time and caller:\n" + host)
            print(table, flush=True)
            device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in averages)
            rows[strategy] = {"round_wall_ms": wall * 1e3, "device_ms": device_us / 1e3, "table": name}
            del engine
        rows["spec_vs_plain_round"] = rows[args.strategy]["round_wall_ms"] / rows["disable"]["round_wall_ms"]
        out[batch] = rows
    return out


def phase_tests(log: Path, seconds: float, tests: list[str]) -> dict:
    """The GPU tests, verbose, into `log` (what ran before a timeout is kept), run from the repository root whatever
    the working directory; pytest failing with no FAILED test (a path or usage error: 4, nothing collected: 5) is
    the phase's error, not a pass."""
    with log.open("w") as sink:
        try:
            code = subprocess.run(
                [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *tests],
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=max(10.0, seconds),
                cwd=ROOT,
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    lines = log.read_text().splitlines()
    value = {"returncode": code, "failed": [line for line in lines if "FAILED" in line], "tail": lines[-15:]}
    if code not in (0, "timeout") and not value["failed"]:
        value["error"] = f"pytest exited {code} with no FAILED test (see the tail)"
    return value


def phase_long_tail(args, device: str) -> dict:
    """The bundled model and drafter on the long-tail batch (`fastrl.bench.long_tail`: T=1, lengths from its EOS),
    plain, static trees and the bandit; its printed table, kept whole."""
    from fastrl.bench.long_tail import main as long_tail_bench

    argv = ["--device", device, "--requests", str(args.long_tail), "--selectors", "3_1_4,5_1_6,bandit", "--warmup"]
    return {"argv": argv, "table": printed_table(long_tail_bench, argv + ["--max-new-tokens", "512"])}


def phase_admission(args, device: str) -> dict:
    """The bundled model on 2,048 task requests queued on 256 slots, admitted as slots free and in batches of 32
    (`fastrl.bench.admission`: paired repeats, tokens checked identical); its printed table, kept whole."""
    from fastrl.bench.admission import main as admission_bench

    requests, slots, admit = ("64", "16", "1,4") if args.tiny else ("2048", "256", "1,32")
    argv = ["--device", device, "--repeats", "2", "--requests", requests, "--batch-size", slots, "--admit", admit]
    return {"argv": argv, "table": printed_table(admission_bench, argv)}


def printed_table(bench_main, argv: list[str]) -> list[str]:
    """What a benchmark's ``main(argv)`` prints, echoed and returned line by line (kept whole in results.json)."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            bench_main(argv)
        except SystemExit as err:  # its usage error (on stderr) fails this phase, not the whole check
            raise RuntimeError(f"{' '.join(argv)}: exited with {err.code}") from None
    print(text.getvalue(), flush=True)
    return text.getvalue().splitlines()


def repo_path(text: str) -> str:
    """An argparse ``type``: a test file or directory (``path::test`` too), relative ones against the repository
    root (where the tests phase runs pytest)."""
    path = text.split("::")[0]
    if not path or not (ROOT / path).exists():
        raise argparse.ArgumentTypeError(f"{path} is not in {ROOT}")
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, every value checked before a model is built or a phase runs (argparse's one-line error
    naming the flag)."""
    from fastrl.engine.machine import check_device
    from fastrl.strategy.strategy import check_strategy_names

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", default="/tmp/fastrl-engine-check")
    parser.add_argument(
        "--phases", type=name_list(PHASES), default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}"
    )
    parser.add_argument("--long-tail", type=at_least(1), default=256, help="requests in the long-tail batch")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu needs --tiny to be quick")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (a smoke run of this script)")
    parser.add_argument("--batch-sizes", type=int_list(1), default="1,8,64,256")
    parser.add_argument("--prompt-len", type=at_least(1), default=256)
    parser.add_argument("--new-tokens", type=at_least(1), default=128)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--strategy", default="5_1_6", help="the speculative strategy the profile phase takes")
    parser.add_argument(
        "--profile-batches", type=int_list(1), default="1,256", help="batch sizes the profile phase takes"
    )
    parser.add_argument(
        "--tests",
        type=lambda text: [repo_path(t) for t in text.split(",")],
        default=",".join(TESTS),
        help="test files (comma-separated, relative to the repository root)",
    )
    parser.add_argument("--tests-seconds", type=positive_float, default=240.0, help="at most this long for the tests")
    parser.add_argument(
        "--deadline", type=positive_float, default=520.0, help="seconds for all phases (the tests get the rest)"
    )
    parser.add_argument("--bandwidth", type=positive_float, default=None, help="bytes/s (default: the card's, by name)")
    args = parser.parse_args(argv)
    try:
        check_device("--device", args.device)
        check_strategy_names("--strategy", [args.strategy])
    except ValueError as err:
        parser.error(str(err))
    return args


def main(argv: list[str] | None = None) -> None:
    """Every phase of ``--phases`` in turn, each one's result (or error) written to results.json as it ends."""
    args = parse_args(argv)
    out = Path(args.out)
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    results = open_results(out, Path(args.work), {"device": name, "torch": torch.__version__, "tiny": args.tiny})
    if args.bandwidth is None:  # the data sheets' peak memory bandwidth; a copy reaches ~90% of it
        args.bandwidth = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), 3.35e12)
    results.record("bandwidth_bytes_per_s", args.bandwidth)
    begin = time.perf_counter()
    model, drafter = build(args.tiny, device, dtype)
    for phase in args.phases:
        start = time.perf_counter()
        try:
            if start - begin > args.deadline - 20.0:
                raise TimeoutError(f"skipped: {start - begin:.0f} s of the {args.deadline:.0f} s deadline spent")
            if phase == "tests":
                left = args.deadline - (time.perf_counter() - begin) - 5.0
                value = phase_tests(out / "tests.txt", min(args.tests_seconds, left), args.tests)
            elif phase == "attention":
                from fastrl.bench.attention import main as attention_bench

                (out / "attention.json").unlink(missing_ok=True)  # this phase's own file, of an earlier call
                attention_bench(["--device", device, "--repeats", "20", "--json", str(out / "attention.json")])
                value = json.loads((out / "attention.json").read_text())
            elif phase == "plain":
                value = phase_plain(model, args, device, dtype)
            elif phase == "profile":
                value = phase_profile(model, drafter, args, device, dtype)
            elif phase == "long_tail":
                value = phase_long_tail(args, device)
            elif phase == "admission":
                value = phase_admission(args, device)
            else:  # parse_args took only PHASES
                raise ValueError(f"--phases: unknown phase {phase!r}")
        except (Exception, SystemExit) as err:  # record it and go on: the other phases are still worth having
            # (a benchmark's own argparse refusal is a SystemExit)
            value = {"error": f"{type(err).__name__}: {err}"[:2000]}
        results.record(phase, {"value": value, "seconds": time.perf_counter() - start})
        print(f"== {phase} ({time.perf_counter() - start:.0f} s): {json.dumps(value, default=str)[:1500]}", flush=True)


if __name__ == "__main__":
    main()
