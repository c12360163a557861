"""Aten ops a decode step dispatches around its CUDA-graph replays, counted on the CPU: what a GPU launches eagerly
each round (its host cost grows with the count, not with the batch). The engine runs its graph path through
`ModelRunner(graph_capture=...)` with PyTorch's attention, so every op a GPU would launch shows up as an aten op.

    python -m fastrl.bench.eager_ops disable,5_1_6 16,64
    python -m fastrl.bench.eager_ops disable 1 --where    # and which line of fastrl dispatched each op
"""

from __future__ import annotations

import collections
import random
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CONTEXT = 400  # max_model_len of the engines timed (50-token prompts, 100 new tokens)


class OpCounter(TorchDispatchMode):
    """Counts aten ops by name while `on` (`graph_path_counted` turns it off inside graph replays); with `where`,
    also by the line of fastrl that dispatched each (`lines`: (file:line function, op) -> count)."""

    def __init__(self, where: bool = False) -> None:
        super().__init__()
        self.on, self.ops = True, collections.Counter()
        self.where, self.lines = where, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on:
            self.ops[func.overloadpacket.__name__] += 1
            if self.where:
                self.lines[(_caller(), func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    """The innermost frame in fastrl's own code (this bench's left out), as ``path:line function``."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if "/fastrl/" in path and not path.endswith("bench/eager_ops.py"):
            return f"{path.rsplit('/fastrl/', 1)[1]}:{frame.lineno} {frame.name}"
    return "(outside fastrl)"


@contextmanager
def graph_path_counted(counter: OpCounter) -> Iterator[None]:
    """Engines built inside run their CUDA-graph path on any device (a replay runs the round's function again),
    and `counter` stops counting during replays."""
    import fastrl.engine.cuda_graphs as cuda_graphs
    import fastrl.engine.engine as engine_module
    from fastrl.engine.runner import ModelRunner

    replay, runner = cuda_graphs.CapturedRound.replay, engine_module.ModelRunner

    def counted_replay(self) -> None:
        counter.on = False
        try:
            replay(self)
        finally:
            counter.on = True

    cuda_graphs.CapturedRound.replay = counted_replay
    engine_module.ModelRunner = partial(ModelRunner, graph_capture=lambda fn: fn())
    try:
        yield
    finally:
        cuda_graphs.CapturedRound.replay, engine_module.ModelRunner = replay, runner


def count_steps(engine, counter: OpCounter, steps: int, warmup: int = 3) -> None:
    """Count (afresh) the eager ops of ``engine``'s next ``steps`` steps, after ``warmup`` uncounted ones (the
    prefill and the first rounds); the engine runs its graph path when built inside ``graph_path_counted``."""
    for _ in range(warmup):
        engine.step()
    counter.ops.clear()
    counter.lines.clear()
    with counter:
        for _ in range(steps):
            engine.step()


def print_lines(lines: collections.Counter, steps: int) -> None:
    """The ops a step dispatched by file (most first), then by line within each file."""
    files: collections.Counter[str] = collections.Counter()
    by_line: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for (line, op), n in lines.items():
        files[line.split(":", 1)[0]] += n
        by_line[line][op] += n
    for file, total in files.most_common():
        print(f"  {file}: {total / steps:g} a step")
        for line in sorted(k for k in by_line if k.split(":", 1)[0] == file):
            ops = ", ".join(f"{op} {n / steps:g}" for op, n in by_line[line].most_common())
            where = line.split(":", 1)[1] if ":" in line else "(no line)"
            print(f"    {where}: {ops}")


def main(argv: list[str] | None = None) -> None:
    """Print the eager aten ops a decode step dispatches, per strategy and batch size."""
    import argparse

    from fastrl.adaptive.fixed import FixedSelector
    from fastrl.assets_path import bundled_model_dir
    from fastrl.bench.cli_args import int_list, strategy_list
    from fastrl.commands.engine_setup import check_kv_memory, load_speculative_models
    from fastrl.engine.config import EngineConfig
    from fastrl.engine.engine import Engine
    from fastrl.models.checkpoint import read_config
    from fastrl.sampling.params import SamplingParams
    from fastrl.strategy.strategy import Strategy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "strategies",
        metavar="STRATEGIES",
        nargs="?",
        type=strategy_list,
        default=["disable", "5_1_6"],
        help="comma-separated strategies (default disable,5_1_6)",
    )
    parser.add_argument(
        "batches",
        metavar="BATCHES",
        nargs="?",
        type=int_list(1),
        default=[16, 64],
        help="comma-separated batch sizes (default 16,64)",
    )
    parser.add_argument("--where", action="store_true", help="also list the ops by the line of fastrl that made them")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    strategies, batches = args.strategies, args.batches
    try:  # each engine's KV cache: slots of CONTEXT entries
        check_kv_memory("batch", read_config(bundled_model_dir()), max(batches), torch.float32, "cpu", CONTEXT)
    except ValueError as err:
        parser.error(f"argument BATCHES: {err}")
    torch.set_num_threads(1)
    policy, drafter, _ = load_speculative_models("", "", "cpu")
    counter = OpCounter(where=args.where)
    with graph_path_counted(counter):
        for name in strategies:
            strategy = Strategy.parse(name)
            for batch in batches:
                config = EngineConfig(max_batch_size=batch, max_model_len=CONTEXT, attention_kernel=False)
                engine = Engine(policy, config, drafter if strategy.uses_drafter else None, FixedSelector(strategy))
                rng = random.Random(0)
                params = SamplingParams(max_new_tokens=100, temperature=1.0, ignore_eos=True)
                for _ in range(batch):
                    engine.add_request([rng.randrange(3, policy.config.vocab_size) for _ in range(50)], params)
                count_steps(engine, counter, 5)
                top = ", ".join(f"{op} {n / 5:.0f}" for op, n in counter.ops.most_common(8))
                print(f"{name} batch {batch}: {sum(counter.ops.values()) / 5:.0f} eager aten ops a step ({top})")
                if args.where:
                    print_lines(counter.lines, steps=5)


if __name__ == "__main__":
    main()
