"""Evaluates the bundled policy on the arithmetic-chain task: accuracy per size bucket and response-length
statistics, greedy and sampled at temperature 1, on a fixed-seed sample stratified by bucket.

    python recipes/bundled_model/evaluate.py --model fastrl/assets/arith-tiny --overwrite

Writes ``eval.json`` into the model directory (or ``--out``); a file already there is replaced only with
``--overwrite`` (``sft.py`` removes the replaced model's). Every flag and the output are checked before the model
loads, and the file is written through a rename. Length quantiles are given for the sample itself
and re-weighted to the task's natural size distribution (each bucket weighted by its probability).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

# Sleeping (not spinning) OpenMP workers: on a CPU shared with other jobs, spinning threads slow training ~5x.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from fastrl.bench.cli_args import at_least, existing_dir
from fastrl.commands.output_guard import OutputTarget, check_output, write_text
from fastrl.rl.tasks import ArithChainTask, Problem, TaskConfig
from fastrl.rl.tasks.solution import longest_solution


@dataclass
class EvalConfig:
    """What to evaluate and how (every field is a ``--flag``)."""

    model: str = "fastrl/assets/arith-tiny"
    out: str = ""
    seed: int = 1234
    per_bucket: int = 50
    batch_size: int = 25
    sampled: bool = True
    threads: int = 2


@dataclass
class Outcome:
    """One decoded response: its problem's bucket, its reward, its length in tokens (including <eos>) and whether
    it ended with <eos> before the token limit."""

    bucket: str
    reward: float
    length: int
    finished: bool


def stratified_problems(task: ArithChainTask, per_bucket: int, rng: random.Random) -> list[Problem]:
    """`per_bucket` problems for every size bucket, drawn from the task's own distribution within the bucket."""
    chosen: dict[str, list[Problem]] = {name: [] for name in task.bucket_names()}
    while any(len(v) < per_bucket for v in chosen.values()):
        problem = task.sample_problem(rng)
        bucket = chosen[task.size_bucket(problem)]
        if len(bucket) < per_bucket:
            bucket.append(problem)
    return [p for name in task.bucket_names() for p in chosen[name]]


def bucket_probabilities(task: ArithChainTask) -> dict[str, float]:
    """Probability of each size bucket under the task's size distribution."""
    probs = {name: 0.0 for name in task.bucket_names()}
    for size in range(task.config.n_min, task.config.n_max + 1):
        probs[task.bucket_of_size(size)] += task.sizes.probability(size)
    return probs


@torch.no_grad()
def decode(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: ArithChainTask,
    problems: list[Problem],
    batch_size: int,
    temperature: float,
) -> list[Outcome]:
    """Generates a response per problem (greedy when temperature is 0), batching problems of similar size."""
    outcomes: list[Outcome] = []
    ordered = sorted(problems, key=lambda p: p.size)
    for start in range(0, len(ordered), batch_size):
        batch = ordered[start : start + batch_size]
        enc = tokenizer([p.prompt for p in batch], return_tensors="pt", padding=True, padding_side="left")
        longest = max(len(longest_solution(p.size, task.config.value_max, task.config.max_checks)) for p in batch)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {}
        generated = model.generate(
            **enc,
            max_new_tokens=longest + 8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **({"do_sample": False} | sampling),
        )  # [B, prompt + new]
        new_tokens = generated[:, enc["input_ids"].shape[1] :]  # [B, new]
        for problem, row in zip(batch, new_tokens.tolist(), strict=True):
            finished = tokenizer.eos_token_id in row
            length = row.index(tokenizer.eos_token_id) + 1 if finished else len(row)
            text = tokenizer.decode(row[:length], skip_special_tokens=True)
            outcomes.append(Outcome(task.size_bucket(problem), task.reward(problem, text), length, finished))
    return outcomes


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The smallest value whose cumulative weight reaches fraction `q` of the total."""
    pairs = sorted(zip(values, weights, strict=True))
    total, acc = sum(weights), 0.0
    for value, weight in pairs:
        acc += weight
        if acc >= q * total - 1e-12:
            return float(value)
    return float(pairs[-1][0])


def length_stats(lengths: list[int], weights: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 and the tail ratio p99/p50 of lengths under the given sample weights."""
    p50, p90, p99 = (weighted_quantile(lengths, weights, q) for q in (0.5, 0.9, 0.99))
    return {"p50": p50, "p90": p90, "p99": p99, "p99_over_p50": round(p99 / p50, 2), "max": float(max(lengths))}


def summarize(outcomes: list[Outcome], probs: dict[str, float]) -> dict[str, object]:
    """Accuracy per bucket (and overall, re-weighted to the natural distribution) and length statistics."""
    counts = {name: sum(o.bucket == name for o in outcomes) for name in probs}  # every bucket is sampled
    accuracy = {name: sum(o.reward for o in outcomes if o.bucket == name) / counts[name] for name in probs}
    natural = [probs[o.bucket] / counts[o.bucket] for o in outcomes]
    lengths = [o.length for o in outcomes]
    return {
        "accuracy": {name: round(acc, 3) for name, acc in accuracy.items()},
        "accuracy_natural": round(sum(probs[n] * accuracy[n] for n in probs), 3),
        "unfinished": {
            name: sum(not o.finished for o in outcomes if o.bucket == name) / counts[name] for name in counts
        },
        "length_natural": length_stats(lengths, natural),
        "length_sample": length_stats(lengths, [1.0] * len(lengths)),
    }


def reference_lengths(task: ArithChainTask, count: int, rng: random.Random) -> dict[str, float]:
    """Length statistics (tokens incl. <eos>) of the task's own solutions under its natural size distribution."""
    lengths = [len(task.solution_text(p, rng)) + 1 for p in task.sample_batch(count, rng)]
    return length_stats(lengths, [1.0] * count)


def evaluate(cfg: EvalConfig, out: OutputTarget) -> None:
    """Runs the evaluation, prints a table and writes eval.json (``out``)."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(cfg.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    task = ArithChainTask(TaskConfig(context_length=model.config.max_position_embeddings))
    problems = stratified_problems(task, cfg.per_bucket, random.Random(cfg.seed))
    probs = bucket_probabilities(task)
    result: dict[str, object] = {"eval_config": dataclasses.asdict(cfg), "bucket_probability": probs}
    modes = {"greedy": 0.0, "sampled_t1": 1.0} if cfg.sampled else {"greedy": 0.0}
    for mode, temperature in modes.items():
        start = time.perf_counter()
        outcomes = decode(model, tokenizer, task, problems, cfg.batch_size, temperature)
        result[mode] = summarize(outcomes, probs) | {"seconds": round(time.perf_counter() - start, 1)}
    result["reference_solutions"] = reference_lengths(task, 5000, random.Random(cfg.seed))
    print(f"{'bucket':>8} {'P(bucket)':>10} " + " ".join(f"{m:>11}" for m in modes))
    for name in task.bucket_names():
        accs = " ".join(f"{result[m]['accuracy'][name]:>11.3f}" for m in modes)
        print(f"{name:>8} {probs[name]:>10.3f} {accs}")
    for mode in modes:
        print(f"{mode}: natural accuracy {result[mode]['accuracy_natural']}, lengths {result[mode]['length_natural']}")
    print(f"reference solutions: {result['reference_solutions']}")
    write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.given}")


FLAG_TYPES = {"model": existing_dir, "out": str, "seed": at_least(0)}
"""The argparse type of each EvalConfig field but ``sampled``; any other (a count) is an integer >= 1."""
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def check_model(model: Path) -> str:
    """Why ``model`` is not a model directory this script loads (a config, weights and a tokenizer), or ""."""
    from transformers import AutoConfig

    if not any((model / name).is_file() for name in WEIGHTS):
        return f"no weights ({' or '.join(WEIGHTS)})"
    if not (model / "tokenizer_config.json").is_file():
        return "no tokenizer (tokenizer_config.json)"
    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        return f"its config does not load ({str(err).splitlines()[0]})"
    return ""


def parse_config(argv: list[str] | None = None) -> tuple[EvalConfig, OutputTarget]:
    """EvalConfig from the command line, one ``--field-name`` per dataclass field, and its checked output: a bad
    value is one usage error naming the flag, before the model loads."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(EvalConfig):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=FLAG_TYPES.get(f.name, at_least(1)), default=f.default)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    args = vars(parser.parse_args(argv))
    overwrite = args.pop("overwrite")
    model = args["model"] = str(args["model"])
    problem = check_model(Path(model))
    if problem:
        parser.error(f"--model {model} is not a model directory: {problem}")
    out = args["out"] or str(Path(model) / "eval.json")
    flag = "--out" if args["out"] else "--out (default: the model's eval.json)"
    if (Path(out).exists() or Path(out).is_symlink()) and not overwrite and not Path(out).is_dir():
        parser.error(f"{flag} {out} exists; choose a new file, or pass --overwrite to replace it")
    model_files = {f"--model's {p.name}": str(p) for p in Path(model).iterdir() if p.name != "eval.json"}
    try:
        target = check_output("--out", out, model_files)
    except ValueError as err:
        parser.error(str(err).replace("--out=", f"{flag} ", 1))
    return EvalConfig(**args), target


def main(argv: list[str] | None = None) -> None:
    evaluate(*parse_config(argv))


if __name__ == "__main__":
    main()
