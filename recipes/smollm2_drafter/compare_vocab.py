"""Accept length at batch size 1 on the recipe's held-out prompts, drafting over the drafter's reduced vocabulary
and over the full one (same weights), for each strategy and temperature.

    python recipes/smollm2_drafter/compare_vocab.py runs/smollm2_drafter --strategies 3_1_4 5_1_6 --prompts 4

Writes RUN/compare_vocab.json (an existing one is replaced only with --overwrite); the run directory, its drafter's
metrics.json and every flag are checked before the model loads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.atomic_files import write_atomic
from fastrl.bench.cli_args import at_least, existing_dir, sampling_temperature, strategy_name
from fastrl.commands.engine_setup import resolve_model_dir
from fastrl.commands.train_drafter_config import TrainDrafterConfig
from fastrl.commands.train_drafter_prompts import file_prompt_ids, split_prompts
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter

CONFIG_KEYS = ("model", "prompts", "eval_prompts", "seed", "chat_template", "max_new_tokens")
"""What this comparison reads of the train-drafter config recorded in the run's drafter/metrics.json."""


def run_config(run: Path) -> dict:
    """The train-drafter config of the recipe's run directory; ValueError naming the file when it is missing or
    lacks what this comparison reads."""
    metrics = run / "drafter" / "metrics.json"
    if not metrics.is_file():
        raise ValueError(f"{metrics} is missing: is {run} the recipe's output directory (run.sh's OUT_DIR)?")
    try:
        cfg = json.loads(metrics.read_text())["config"]
        missing = [key for key in CONFIG_KEYS if key not in cfg]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{metrics}: not a train-drafter metrics file with a config ({err})") from None
    if missing:
        raise ValueError(f"{metrics}: its config lacks {missing}")
    if not Path(cfg["prompts"]).is_file():
        raise ValueError(f"the run's prompts file {cfg['prompts']} (from {metrics}) is missing")
    return cfg


def accept_length(engine: Engine, inputs: list[GenerateInput]) -> float:
    """Token-weighted mean tokens per round (accepted drafts + 1) of one run."""
    engine.generate(inputs)
    rows = sum(s.batch_size for s in engine.round_stats)
    return sum(sum(s.accepted_tokens) for s in engine.round_stats) / rows + 1.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=existing_dir, help="the recipe's output directory")
    parser.add_argument("--strategies", nargs="+", type=strategy_name, default=["3_1_4", "5_1_6"])
    parser.add_argument("--temperatures", nargs="+", type=sampling_temperature, default=[0.0])
    parser.add_argument("--prompts", type=at_least(0), default=0, help="the first N held-out prompts (0: all)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing RUN/compare_vocab.json")
    args = parser.parse_args(argv)
    run, strategies = args.run, args.strategies
    out = run / "compare_vocab.json"
    if out.exists() and not args.overwrite:
        parser.error(f"{out} exists; pass --overwrite to replace it")
    try:
        cfg = run_config(run)
        model_dir = resolve_model_dir(cfg["model"])
    except (ValueError, ImportError) as err:
        parser.error(f"run {run}: {err}")
    torch.set_num_threads(1)
    policy, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
    split_cfg = TrainDrafterConfig(prompts=cfg["prompts"], eval_prompts=cfg["eval_prompts"], seed=cfg["seed"])
    _, held = split_prompts(file_prompt_ids(cfg["prompts"], tokenizer, cfg["chat_template"]), split_cfg)
    held = held[: args.prompts or len(held)]
    drafter = load_drafter(run / "drafter", policy)[0]
    reduced = drafter.draft_vocab
    new_tokens = cfg["max_new_tokens"]
    config = EngineConfig(max_batch_size=1, max_model_len=max(len(p) for p in held) + new_tokens + 1)
    results = []
    for temperature in args.temperatures:
        inputs = [
            GenerateInput(p, SamplingParams(max_new_tokens=new_tokens, temperature=temperature, seed=i))
            for i, p in enumerate(held)
        ]
        for strategy in strategies:
            row = {"strategy": strategy, "temperature": temperature}
            for name, vocab in (("full", None), ("reduced", reduced)):
                drafter.set_draft_vocab(vocab)
                row[name] = accept_length(
                    Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy)), inputs
                )
            row["reduced/full"] = row["reduced"] / row["full"]
            print(json.dumps(row), flush=True)
            results.append(row)
    size = None if reduced is None else int(reduced.numel())
    write_atomic(out, json.dumps({"draft_vocab_size": size, "rows": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
