"""What float64 rollouts cost against float32 on this CPU, side by side in one process (bundled model and drafter).

    python recipes/results/dtype_cost.py

Prints wall seconds per (dtype, strategy) for 32 task prompts at T=1, 128 new tokens, batch 32, one thread, and
checks that plain and speculative tokens agree within each dtype.
"""

from __future__ import annotations

import random
import time

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter


def main() -> None:
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(bundled_model_dir())
    rng = random.Random(0)
    prompts = [tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"] for _ in range(32)]
    inputs = [
        GenerateInput(p, SamplingParams(temperature=1.0, max_new_tokens=128, seed=i)) for i, p in enumerate(prompts)
    ]
    for dtype in ("float32", "float64"):
        tokens = {}
        for strategy in ("disable", "5_1_6"):
            policy = load_model(bundled_model_dir())
            drafter = load_drafter(bundled_drafter_dir(), policy)[0]
            config = EngineConfig(max_batch_size=32, dtype=dtype, max_model_len=256)
            engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy))
            start = time.perf_counter()
            tokens[strategy] = [o.token_ids for o in engine.generate(inputs)]
            print(f"{dtype:8s} {strategy:8s} {time.perf_counter() - start:6.2f} s", flush=True)
        print(f"{dtype}: speculative tokens equal plain: {tokens['disable'] == tokens['5_1_6']}")


if __name__ == "__main__":
    main()
