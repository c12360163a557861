"""A long-tail rollout batch: 64 task requests sampled at T=1 (lengths heavy-tailed), wall time per strategy.

Every selector's engine runs the same requests, the engines stepping in lockstep, so a shared machine's load falls on
all of them alike. The bundled model's task prompts by default; any model with its drafter and a prompts file
(`--model smollm2 --prompts-file recipes/smollm2_drafter/heldout_prompts.jsonl --temperature 0`) as well."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.factory import build_selector
from fastrl.bench.cli_args import at_least
from fastrl.engine.calibration import calibrate_engine
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.heap import settled_heap
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.selector import StrategySelector
from fastrl.strategy.strategy import check_strategy_names
from fastrl.telemetry.round_summary import summarize_rounds


@dataclass
class LongTailRow:
    """Wall time of the whole batch under one strategy selector, and its speedup over plain; the engine's round
    statistics and strategy selector are kept for arm tables, plots and cost fitting."""

    selector: str
    wall_s: float
    speedup: float
    rounds: int
    mean_accept_length: float
    round_stats: list = field(default_factory=list, repr=False)
    strategy_selector: object = field(default=None, repr=False)
    decode_s: float = 0.0
    """Median over repeats of the summed decode-round times (the selector's part: prefill is the same for all)."""
    decode_speedup: float = 0.0
    """Plain's median decode time over this selector's."""


def bench_long_tail(
    policy: CausalLM,
    drafter: EagleDrafter,
    prompts: list[list[int]],
    selectors: list[str],
    max_new_tokens: int,
    repeats: int,
    batch_size: int = 64,
    bandit: BanditConfig | None = None,
    max_model_len: int | None = None,
    warm_start: dict | None = None,
    temperature: float = 1.0,
) -> list[LongTailRow]:
    """Run the same batch under each strategy selector ('disable' first is the baseline), the engines stepping in
    lockstep (see ``run_lockstep``), ``repeats`` times: the median summed step time of each; outputs must agree.
    ``warm_start``: a bandit ``state_dict`` every bandit starts from (what an earlier run learned); request i samples
    at ``temperature`` with seed i.
    `max_model_len` bounds the KV cache (None: the model's whole context)."""
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=i))
        for i, p in enumerate(prompts)
    ]
    names = ["disable"] + [p for p in selectors if p != "disable"]
    if any(name.split(":")[0] == "bandit" for name in names):  # calibrate once, untimed: timed engines read the cache
        _engine(policy, drafter, "bandit", batch_size, bandit, max_model_len)
    times: dict[str, list[float]] = {name: [] for name in names}
    decode: dict[str, list[float]] = {name: [] for name in names}
    engines: dict[str, Engine] = {}
    outputs: dict[str, list] = {}
    for _ in range(repeats):
        engines = {
            name: _engine(policy, drafter, name, batch_size, bandit, max_model_len, warm_start) for name in names
        }
        with settled_heap():  # as `fastrl generate` and the rollout workers decode: start-up's objects frozen
            seconds, outputs = run_lockstep(engines, inputs)
        for name in names:
            times[name].append(seconds[name])
            decode[name].append(sum(s.wall_time_s for s in engines[name].round_stats))
    reference = [o.token_ids for o in outputs["disable"]]
    rows: list[LongTailRow] = []
    for name in names:
        if [o.token_ids for o in outputs[name]] != reference:
            raise RuntimeError(f"selector {name} changed the output: exactness is broken")
        engine, wall = engines[name], statistics.median(times[name])
        summary = summarize_rounds(engine.round_stats)
        base = statistics.median(times["disable"])
        rows.append(
            LongTailRow(
                name,
                wall,
                base / wall,
                summary.rounds,
                summary.mean_accept_length,
                engine.round_stats,
                engine.selector,
                statistics.median(decode[name]),
                statistics.median(decode["disable"]) / statistics.median(decode[name]),
            )
        )
    return rows


def _engine(
    policy: CausalLM,
    drafter: EagleDrafter,
    name: str,
    batch_size: int,
    bandit: BanditConfig | None,
    max_model_len: int | None,
    warm_start: dict | None = None,
) -> Engine:
    device = str(next(policy.parameters()).device)
    engine = Engine(
        policy,
        EngineConfig(max_batch_size=batch_size, max_model_len=max_model_len, device=device),
        drafter=None if name == "disable" else drafter,
        selector=_selector(name, bandit),
    )
    # the bandit's round costs, as engine start gives them (from the cache once measured); the bench times plain itself
    calibrate_engine(engine, meter=False)
    if warm_start is not None and isinstance(engine.selector, BanditSelector):
        engine.selector.warm_start(warm_start)
    return engine


def learned_state(
    policy: CausalLM,
    drafter: EagleDrafter,
    inputs: list[GenerateInput],
    batch_size: int,
    bandit: BanditConfig | None,
    max_model_len: int | None,
) -> dict:
    """The state of a bandit after generating ``inputs`` (other prompts than the timed ones): what a run carries
    into its next rollout."""
    engine = _engine(policy, drafter, "bandit", batch_size, bandit, max_model_len)
    engine.generate(inputs)
    return engine.selector.state_dict()


def run_lockstep(engines: dict[str, Engine], inputs: list[GenerateInput]) -> tuple[dict[str, float], dict[str, list]]:
    """Generate ``inputs`` on every engine, one step at a time, the next step always the unfinished engine's that has
    used the least time so far: their steps spread over the same stretch of wall-clock time, so a shared machine's
    slow and fast spells fall on all of them alike. Each engine's summed step time, and its outputs in input order."""
    ids = {name: [e.add_request(i.prompt_ids, i.params, i.request_id) for i in inputs] for name, e in engines.items()}
    seconds = dict.fromkeys(engines, 0.0)
    finished: dict[str, dict] = {name: {} for name in engines}
    while running := [name for name, e in engines.items() if e.has_unfinished()]:
        name = min(running, key=seconds.__getitem__)
        start = time.perf_counter()
        out = engines[name].step()
        seconds[name] += time.perf_counter() - start
        finished[name].update({o.request_id: o for o in out if o.finished})
    return seconds, {name: [finished[name][i] for i in ids[name]] for name in engines}


def _selector(name: str, bandit: BanditConfig | None) -> StrategySelector:
    """``build_selector(name)``, and ``bandit:KEY=VALUE``: the bandit with one of its settings changed (a JSON value,
    e.g. ``bandit:explore_budget=0.02``), to compare settings side by side in one lockstep run."""
    if not name.startswith("bandit:"):
        return build_selector(name, bandit=bandit)
    key, _, value = name.removeprefix("bandit:").partition("=")
    try:
        setting = json.loads(value)
    except json.JSONDecodeError as err:
        raise ValueError(f"selector {name!r}: {value!r} is not a JSON value") from err
    try:
        return build_selector("bandit", bandit=asdict(bandit or BanditConfig()) | {key: setting})
    except ValueError as err:
        raise ValueError(f"selector {name!r}: {err}") from None


def check_selector_names(key: str, names: list[str], arms: list[str]) -> None:
    """ValueError naming ``key`` for a ``bandit:KEY=VALUE`` selector that does not build (checked before any run)."""
    for name in names:
        if name.startswith("bandit:"):
            try:
                _selector(name, BanditConfig(strategies=list(arms)))
            except ValueError as err:
                raise ValueError(f"{key}: {err}") from None


def cost_measurements(rows: list[LongTailRow]) -> list[dict]:
    """Every measured round as {strategy, batch_size, seconds}: what `python -m fastrl.adaptive.sim --costs` fits."""
    return [
        {"strategy": str(s.strategy), "batch_size": s.batch_size, "seconds": s.wall_time_s}
        for row in rows
        for s in row.round_stats
    ]


def check_arguments(args: Any) -> None:
    """ValueError naming the flag of the first bad value of ``main``'s arguments that argparse's types leave (before
    any model loads)."""
    from fastrl.engine.machine import check_device
    from fastrl.sampling.params import check_temperature

    check_temperature("--temperature", args.temperature)
    check_device("--device", args.device)
    selectors = args.selectors.split(",")
    check_strategy_names("--selectors", selectors, ("bandit", "ema", "bandit:"))
    twice = next((name for i, name in enumerate(selectors) if name in selectors[:i]), None)
    if twice is not None:
        raise ValueError(f"--selectors names {twice!r} twice; name each selector once")
    check_selector_names("--selectors", selectors, args.arms)


def check_models(model: str, drafter: str) -> tuple[Path, Path]:
    """The checkpoint directories ``--model`` and ``--drafter`` name (empty ``--drafter``: the one shipped with the
    model), the drafter checked to fit the model; ValueError naming the flag, before either loads."""
    from fastrl.commands.engine_setup import drafter_dir, resolve_model_dir
    from fastrl.models.checkpoint import read_config
    from fastrl.speculative.drafter_checkpoint import check_drafter_fit, read_drafter_info

    model_dir = resolve_model_dir(model, "--model")
    directory = drafter_dir(drafter, model_dir)
    if directory is None:
        raise ValueError(f"--model={model} has no drafter shipped with it; pass --drafter DIR")
    try:
        if not directory.is_dir():
            raise ValueError(f"drafter directory {directory} {'is a file' if directory.exists() else 'does not exist'}")
        check_drafter_fit(directory, read_drafter_info(directory), read_config(model_dir))
    except ValueError as err:
        said = f"--drafter={drafter}" if drafter else f"the drafter shipped with --model={model}"
        raise ValueError(f"{said}: {err}") from None
    return model_dir, directory


def check_slots(args: Any, model_dir: Path, device: str, engines: int) -> None:
    """ValueError naming ``--batch-size`` (or ``--requests`` where it is 0: all at once) when ``engines`` engines of
    that many slots cannot hold even each row's ``--max-new-tokens`` in ``device``'s memory (their KV caches hold the
    prompts too: a lower bound, checked before any model loads or prompt is made)."""
    import torch

    from fastrl.commands.engine_setup import check_kv_memory
    from fastrl.engine.config import default_dtype
    from fastrl.models.checkpoint import read_config

    config = read_config(model_dir)
    key, slots = ("--batch-size", args.batch_size) if args.batch_size else ("--requests", args.requests)
    length = min(config.max_position_embeddings, args.max_new_tokens + 2)
    check_kv_memory(key, config, slots, getattr(torch, default_dtype(device)), device, engines * length)


def main(argv: list[str] | None = None) -> None:
    """Print the long-tail table with the bundled model: every selector against plain, the bandit's choices per
    bucket, decode-round seconds per bucket, and the bandit's estimated plain time against the plain run's."""
    import argparse

    import torch

    from fastrl.adaptive.buckets import DEFAULT_BS_THRESHOLDS, BatchBuckets
    from fastrl.bench.cli_args import strategy_list
    from fastrl.bench.workload import bench_prompts
    from fastrl.commands.prompt_tokens import policy_prompt_ids
    from fastrl.models.checkpoint import load_model
    from fastrl.models.tokenizer import load_tokenizer
    from fastrl.speculative.drafter_checkpoint import load_drafter
    from fastrl.strategy.round_stats import RoundTotals

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument(
        "--requests", type=at_least(1), default=64, help="requests timed (at most the prompts file's lines)"
    )
    parser.add_argument("--group", type=at_least(1), default=1, help="samples per prompt (4: GRPO groups)")
    parser.add_argument("--batch-size", type=at_least(0), default=0, help="most requests at once (0: all; 1: batch 1)")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=1024)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=at_least(1), default=1)
    parser.add_argument(
        "--warmup", action="store_true", help="one untimed pass of every selector first (a GPU's first-use compiles)"
    )
    parser.add_argument("--selectors", default="3_1_4,5_1_6,bandit", help="also bandit:KEY=VALUE (one setting changed)")
    parser.add_argument(
        "--arms",
        type=strategy_list,
        default="12_1_13@0.3,7_1_8,5_1_6,3_1_4,8_4_32,suffix_8,3_1_4+suffix_8,disable",
        help="the bandits' arms, comma-separated",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the engines' CUDA graphs on)")
    parser.add_argument("--model", default="", help="named model (smollm2) or checkpoint dir (default: bundled)")
    parser.add_argument("--drafter", default="", help="drafter directory (default: the one shipped with the model)")
    parser.add_argument(
        "--prompts-file",
        default="",
        help="prompts JSONL, text through the chat template of a chat model (default: task prompts)",
    )
    parser.add_argument(
        "--warm-start",
        type=at_least(0),
        default=0,
        help="bandits start from what one learned on this many other prompts",
    )
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
        model_dir, drafter_dir = check_models(args.model, args.drafter)
        check_slots(args, model_dir, args.device, len({"disable", *args.selectors.split(",")}))  # all step in lockstep
        every = policy_prompt_ids(args.prompts_file, model_dir) if args.prompts_file else None
        torch.set_num_threads(1)
        policy = load_model(model_dir).to(args.device).eval()
        try:
            drafter = load_drafter(drafter_dir, policy)[0].to(args.device)
        except ValueError as err:
            raise ValueError(f"--drafter={args.drafter or drafter_dir}: {err}") from None
        tokenizer = load_tokenizer(model_dir)
    except ValueError as err:
        parser.error(str(err))
    distinct = -(-args.requests // args.group)
    if every is not None:  # the file's first prompts are timed, the next ones warm the bandit up
        if len(every) < distinct + args.warm_start:
            parser.error(f"--prompts-file has {len(every)} prompts, {distinct} timed + {args.warm_start} warm-up asked")
    else:
        every = bench_prompts(tokenizer, "auto", distinct + args.warm_start, 2)
    prompts = [p for p in every[:distinct] for _ in range(args.group)][: args.requests]
    others = every[distinct : distinct + args.warm_start]
    context = min(policy.config.max_position_embeddings, max(map(len, every)) + args.max_new_tokens + 1)
    bandit = BanditConfig(strategies=args.arms)
    warm = None
    if others:  # seeds apart from the timed requests' (0 .. requests - 1)
        earlier = [
            GenerateInput(
                p, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=10**6 + i)
            )
            for i, p in enumerate(others)
        ]
        warm = learned_state(policy, drafter, earlier, args.batch_size or args.requests, bandit, context)

    def bench(repeats: int) -> list[LongTailRow]:
        return bench_long_tail(
            policy,
            drafter,
            prompts,
            args.selectors.split(","),
            args.max_new_tokens,
            repeats,
            args.batch_size or args.requests,
            bandit,
            context,
            warm,
            args.temperature,
        )

    if args.warmup:
        bench(1)
    rows = bench(args.repeats)
    buckets = BatchBuckets(DEFAULT_BS_THRESHOLDS)
    for row in rows:
        totals, per = RoundTotals.of(row.round_stats), {}
        for s in row.round_stats:
            cell = per.setdefault(buckets.label(buckets.index(s.batch_size)), [0.0, 0.0, {}])
            cell[0] += s.wall_time_s
            cell[1] += s.plain_time_estimate_s
            cell[2][str(s.strategy)] = cell[2].get(str(s.strategy), 0) + 1
        estimate = totals.estimated_speedup
        print(
            f"{row.selector:>16} wall {row.wall_s:7.2f}s speedup {row.speedup:5.3f} decode {row.decode_s:6.2f}s "
            f"speedup {row.decode_speedup:5.3f} (medians) | last repeat: rounds {row.rounds:5d} decode "
            f"{totals.wall_time_s:6.2f}s accept {row.mean_accept_length:4.2f} "
            f"estimated speedup {'-' if estimate is None else f'{estimate:.3f}'}"
        )
        for label in buckets.labels():
            if label in per:
                seconds, plain, choices = per[label]
                print(f"{'':>18}bucket {label:>5}: decode {seconds:6.2f}s, plain estimate {plain:6.2f}s, {choices}")


if __name__ == "__main__":
    main()
