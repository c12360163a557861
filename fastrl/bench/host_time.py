"""Plain-decoding throughput and host time per round, in CPU seconds of this process (steadier than wall time on a
shared machine), for comparing two checkouts side by side.

It uses only the engine's public API, so the same file runs against another checkout by path; alternate them:

    PYTHONPATH=/path/to/main   python fastrl/bench/host_time.py throughput 1,64,256 64
    PYTHONPATH=$PWD            python fastrl/bench/host_time.py throughput 1,64,256 64
    PYTHONPATH=/path/to/main   python fastrl/bench/host_time.py host
    PYTHONPATH=$PWD            python fastrl/bench/host_time.py host
"""

from __future__ import annotations

import random
import statistics
import sys
import time

import torch

from fastrl.commands.engine_setup import resolve_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams


def throughput(model: CausalLM, batch: int, new_tokens: int, repeats: int = 3) -> float:
    """Greedy tokens per CPU second at `batch` (prompts of 20-60 random tokens, EOS ignored), median of repeats."""
    rng = random.Random(0)
    prompts = [[rng.randrange(3, model.config.vocab_size) for _ in range(rng.randint(20, 60))] for _ in range(batch)]
    engine = Engine(model, EngineConfig(max_batch_size=batch, max_model_len=256))
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    engine.generate([GenerateInput(p, params) for p in prompts])  # warm-up
    times = []
    for _ in range(repeats):
        start = time.process_time()
        engine.generate([GenerateInput(p, params) for p in prompts])
        times.append(time.process_time() - start)
    return batch * new_tokens / statistics.median(times)


def host_time(model: CausalLM, batch: int, prompt_len: int, rounds: int = 8) -> float:
    """CPU seconds of one plain step outside `CausalLM.forward` (T=1), median over `rounds`."""
    inside, entered = [0.0], [0.0]
    pre = model.register_forward_pre_hook(lambda m, a: entered.__setitem__(0, time.process_time()))
    post = model.register_forward_hook(
        lambda m, a, o: inside.__setitem__(0, inside[0] + time.process_time() - entered[0])
    )
    rng = random.Random(0)
    engine = Engine(model, EngineConfig(max_batch_size=batch, max_model_len=prompt_len + rounds + 8))
    params = SamplingParams(max_new_tokens=rounds + 4, temperature=1.0, ignore_eos=True)
    for _ in range(batch):
        engine.add_request([rng.randrange(3, model.config.vocab_size) for _ in range(prompt_len)], params)
    engine.step()
    engine.step()
    host = []
    for _ in range(rounds):
        inside[0] = 0.0
        start = time.process_time()
        engine.step()
        host.append(time.process_time() - start - inside[0])
    pre.remove()
    post.remove()
    return statistics.median(host)


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    model = load_model(resolve_model_dir(None))
    if argv[0] == "throughput":
        new_tokens = int(argv[2]) if len(argv) > 2 else 64
        for batch in [int(x) for x in argv[1].split(",")]:
            print(f"batch {batch}: {throughput(model, batch, new_tokens):.0f} tok/CPU-s", flush=True)
    elif argv[0] == "host":
        t = {key: host_time(model, *key) for key in ((64, 100), (256, 100), (16, 100), (16, 850))}
        print(f"host per extra row (batch 64 -> 256, 100-token rows): {(t[256, 100] - t[64, 100]) / 192 * 1e6:.1f} us")
        print(f"host at 850-token rows vs 100-token rows (batch 16): {t[16, 850] / t[16, 100]:.2f}x")
    else:
        raise ValueError(f"usage: host_time.py throughput BATCHES [NEW_TOKENS] | host; got {argv}")


if __name__ == "__main__":
    main(sys.argv[1:])
