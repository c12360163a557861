"""Round costs measured at engine start: a few timed rounds of every arm at a few batch sizes, cached on disk.

For each calibration batch size and each of two contexts (``context_plans``: rows of a few dozen keys, and of
hundreds) a throwaway ``Engine`` (the same policy, drafter and engine config, its own small KV cache) decodes that
many requests; the engines take turns running every arm, ``rounds + 1`` times (the first pass is a warm-up); the
round times the engines themselves measure, with the mean context of each level's rounds, become a ``CostModel``.
Requests ignore EOS and are replaced by fresh ones before they could run out of context (``RequestPlan``), so the
batch size holds. The result is saved as JSON under ``<cache>/calibration/`` (``$FASTRL_CACHE``, else
``~/.cache/fastrl``), keyed by the policy and drafter configs, device, dtype, attention backend (and whether drafter
steps run in the CPU kernel), torch threads, arms, sizes, rounds and the requests' plans, and reused by later
engines with the same key.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import random
import stat
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import IO

import torch

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.chain_depth import timing_chains
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.plain_meter import PlainTimeMeter
from fastrl.adaptive.round_times import calibration_sizes
from fastrl.atomic_files import write_atomic
from fastrl.engine.engine import Engine
from fastrl.models.cpu_linear import small_linear_routing
from fastrl.models.named import CACHE_ENV, cache_root
from fastrl.sampling.cpu_noise import uniform_bits_kernel
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.cpu_drafter_step import drafter_step_for
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

PLAIN_REPEATS = 3
"""Plain rounds per calibration pass (one of every other arm)."""
WARMUP_ROUNDS = 16
"""Most untimed plain rounds that start a pass (at least ``MIN_WARMUP_ROUNDS``, then until ``WARMUP_S`` have passed):
the other sizes' rounds left this engine's weights and cache out of the processor's caches, and a small batch takes
several rounds to find them again. On this CPU (the bundled model, float32; ``python -m fastrl.bench.cache_warmup``)
plain rounds at batch 1 right after rounds at batch 64 took 1.65, 1.50, 1.44, 1.40, 1.30, 1.20, 1.10, 1.07x the time
of rounds in a row (at batch 8: 1.20, 1.13, 1.11, 1.09x): after one untimed round the calibration priced plain
decoding at batch 1 ~1.3-1.5x what a rollout's plain rounds cost, and the speedup estimate at the tail too high."""
MIN_WARMUP_ROUNDS = 2
"""Fewest untimed plain rounds that start a pass."""
WARMUP_S = 0.03
"""Seconds of untimed plain rounds that start a pass (within ``MIN_WARMUP_ROUNDS`` and ``WARMUP_ROUNDS`` rounds): a
round of a large batch refills the caches in a few, a batch-1 round of a few ms takes its ~16."""
MIN_PASSES = 5
"""Timed passes at least, whatever ``rounds`` asks: the bandit takes the ratios between arms from the calibration,
and on a loaded machine a median of three rounds still let a spike put 3_1_4 above 5_1_6 at batch 1."""
METER_ROUNDS = 3
"""Rounds per arm and size of the calibration behind a ``PlainTimeMeter`` (the bandit's default ``min_pulls``; the
passes are at least ``MIN_PASSES`` anyway)."""
PROMPT_TOKENS = 256
"""The long context's prompts: a random pattern of up to this many tokens (fewer where the model's context is short;
rows of one batch from a quarter of it to all of it, ``ragged_length``), said twice (history arms then find matches),
and the rest of the model's context the rows' budget. Rollout contexts run to thousands of tokens, and attention over
them weighs on a plain round more than on a verify of a few tokens per row: at batch 64 on this CPU, a 32-token prompt
put a 3_1_4 round at 3.0x a plain one, a 512-token prompt at 2.2x, the long-tail rollouts at 2.3-2.5x."""
SHORT_PROMPT = 8
"""The short context's pattern tokens (said twice): a task prompt's length."""
SHORT_CONTEXT = 64
"""The short context's rows hold at most this many tokens (or one arm's rounds after their prompt, where more):
fresh requests replace them before any arm they could not take. Rounds cost less there: on the bundled model at batch
16 on this CPU a plain round took 3.1 ms at 22 keys a row and 6.0 ms at 467, a 3_1_4 round 2.8x and 3.1x that."""
MIN_CONTEXT = 1024
"""The least context a calibration's engines are given (``calibration_positions``; the model's, where shorter): one
value for most arm sets, so that their cache keys and the contexts they time stay as they were."""
LEVEL_SPREAD = 2.0
"""The long context's rounds attend over at least this many times the short one's keys a row, or the short one is
dropped (a model whose context holds no long level): a line through two near contexts extrapolates noise."""


class ScriptedSelector:
    """Plays the strategy ``next`` holds; its strategy space is every arm calibrated."""

    def __init__(self, strategies: list[Strategy]) -> None:
        self._strategies = list(strategies)
        self.next = self._strategies[0]

    @property
    def strategies(self) -> list[Strategy]:
        """Every arm calibrated."""
        return list(self._strategies)

    def choose(self, batch_size: int) -> Strategy:
        """The scripted strategy."""
        return self.next

    def observe(self, stats: RoundStats) -> None:
        """The calibration reads the engine's round statistics instead."""

    def state_dict(self) -> dict:
        """Nothing to resume."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""


@dataclasses.dataclass(frozen=True)
class RequestPlan:
    """How a calibration's requests fit the model's context: a row takes at most ``budget`` tokens, and fresh
    requests replace the running ones whenever they could not take the rounds that come next (a pass, at its start,
    when a whole pass fits a set of requests; else the next arm's catch-up and timed rounds), so that every round runs
    over the whole batch (requests that ran out of context ended early, and a step then ran no round)."""

    prompt: int
    """Pattern tokens of the longest row (said twice)."""
    budget: int
    """A request's ``max_new_tokens``: its first token (from the prefill) and the rounds it serves."""
    pass_tokens: int
    """Most tokens one pass emits into a row: the untimed and the timed plain rounds, for every arm a catch-up and a
    timed round, and the cold plain round."""
    passes: int
    """Passes in all, the first a warm-up."""

    @property
    def warmup(self) -> int:
        """Most untimed plain rounds that start a pass: ``WARMUP_ROUNDS``, fewer where a request's budget leaves no
        room for them and the timed plain rounds (never fewer than ``MIN_WARMUP_ROUNDS``: ``request_plan`` leaves
        room for those)."""
        return max(MIN_WARMUP_ROUNDS, min(WARMUP_ROUNDS, self.budget - 2 - PLAIN_REPEATS))

    @property
    def context(self) -> int:
        """The context a calibration engine serves: a row's prompt, its budget and one spare position."""
        return 2 * self.prompt + self.budget + 1


def request_plan(
    positions: int, arms: list[Strategy], rounds: int, prompt_tokens: int = PROMPT_TOKENS, context: int | None = None
) -> RequestPlan:
    """The ``RequestPlan`` of timing ``arms`` (plain decoding besides) ``rounds`` times (at least ``MIN_PASSES``) on
    a model of ``positions`` positions: prompts of ``prompt_tokens``, fewer where a whole pass would not fit after
    them; where it would not fit at all, prompts that leave room for the largest step of a pass (an arm's catch-up
    and timed rounds). The rest of the context is every request's budget, or the rest of ``context`` tokens a row
    (at least the largest step). ValueError when the context cannot hold one arm's rounds."""
    arms = _timed_arms(arms)
    timed = [2 * arm.max_accept_length for arm in arms]  # each arm's catch-up and timed rounds
    pass_tokens = WARMUP_ROUNDS + PLAIN_REPEATS + 1 + sum(timed)  # the plain rounds: warm-up, timed, cold
    steps = [MIN_WARMUP_ROUNDS + PLAIN_REPEATS + 1, *timed]  # the least room each step of a pass needs
    whole_pass = (positions - pass_tokens - 2) // 2  # the prompt that leaves room for a whole pass
    one_arm = (positions - max(steps) - 2) // 2  # the prompt that leaves room for the largest step of a pass
    if one_arm < 1:
        raise ValueError(
            f"calibration: the model's context of {positions} positions cannot hold the rounds of "
            f"{[str(a) for a in arms]} (needs {max(steps) + 4}: shallower arms, or bandit.calibrate=false)"
        )
    prompt = min(prompt_tokens, whole_pass if whole_pass >= 1 else one_arm)
    budget = positions - 2 * prompt - 1
    if context is not None:
        budget = min(budget, max(context - 2 * prompt - 1, max(steps) + 1))
    return RequestPlan(prompt, budget, pass_tokens, max(rounds, MIN_PASSES) + 1)


def context_plans(positions: int, arms: list[Strategy], rounds: int) -> list[RequestPlan]:
    """The requests of the two contexts a calibration times, short first: ``SHORT_PROMPT`` rows within
    ``SHORT_CONTEXT`` tokens, and ``request_plan``'s long rows; the long one alone where the model's context leaves it
    no longer than ``LEVEL_SPREAD`` times the short one."""
    long = request_plan(positions, arms, rounds)
    short = request_plan(positions, arms, rounds, SHORT_PROMPT, SHORT_CONTEXT)
    return [short, long] if 2 * long.prompt >= LEVEL_SPREAD * short.context else [long]


class CalibrationBatch:
    """The engine that times rounds at one batch size, and the requests it decodes: fresh ones replace them before
    they could run out of context, and every round is checked to have run over the whole batch."""

    def __init__(
        self, engine: Engine, arms: list[Strategy], size: int, plan: RequestPlan, seed: int, rng: random.Random
    ) -> None:
        """Build the engine and prefill its first requests (``rng`` draws the prompt patterns, ``seed`` the first
        row's sampling seed)."""
        # every row holds its whole context for as long as it runs: the pool is sized for that, not as the engine's
        # own (a kv_cache_tokens that fits the engine's context may not hold one calibration row)
        config = dataclasses.replace(
            engine.config, max_batch_size=size, max_model_len=plan.context, kv_cache_tokens=None
        )
        self.script = ScriptedSelector([*arms, DISABLE])
        self.engine = Engine(engine.model, config, drafter=engine.drafter, selector=self.script)
        self.size, self.plan = size, plan
        self.last = DISABLE  # the strategy of the last round
        self._seed, self._rng = seed, rng
        self._ids: list[str] = []
        self._batches = 0  # sets of requests so far
        self._room = 0  # tokens every running row can still take
        self._refill()

    def start_pass(self) -> None:
        """Fresh requests when the running ones cannot take a whole pass (and a set of requests can), then the pass's
        first rounds, plain and untimed (``RequestPlan.warmup``): the other sizes' rounds left this engine's weights
        and cache out of the processor's caches."""
        if self._room < self.plan.pass_tokens <= self.plan.budget - 1:
            self._refill()
        warmup = self.plan.warmup
        self.make_room(warmup + PLAIN_REPEATS + 1)  # no fresh requests between the warm-up and the timed rounds
        start = time.perf_counter()
        for done in range(warmup):
            if done >= MIN_WARMUP_ROUNDS and time.perf_counter() - start >= WARMUP_S:
                break
            self.round(DISABLE)

    def make_room(self, tokens: int) -> None:
        """Fresh requests when a running row could not take ``tokens`` more."""
        if self._room < tokens:
            self._refill()

    def _refill(self) -> None:
        """End the running requests and prefill ``size`` new ones of a new pattern (a step that runs no round)."""
        for request_id in self._ids:
            self.engine.abort(request_id)
        plan = self.plan
        pattern = [self._rng.randrange(self.engine.model.config.vocab_size) for _ in range(plan.prompt)]
        first_seed = self._seed + self._batches * self.size  # every set samples its own tokens
        self._ids = []
        for row in range(self.size):
            params = SamplingParams(max_new_tokens=plan.budget, temperature=1.0, seed=first_seed + row, ignore_eos=True)
            said = pattern[: ragged_length(plan.prompt, row, self.size)]
            self._ids.append(self.engine.add_request(said + said, params))
        self.engine.step()  # the ended rows leave, the new ones are prefilled
        admitted = len(self.engine.scheduler.running)
        if admitted != self.size or self.engine.scheduler.waiting:
            raise RuntimeError(f"calibration at batch {self.size}: {admitted} of its {self.size} rows were admitted")
        self._batches += 1
        self._room = plan.budget - 1  # the first token came with the prefill
        self.last = DISABLE  # the drafter has read none of the new rows' tokens: a drafter arm catches up first

    def round(self, arm: Strategy) -> RoundStats:
        """Run one round of ``arm`` over every row; its statistics. RuntimeError when the step ran no such round
        (timing whatever round came last would record a stale time)."""
        self.script.next = arm
        rounds = self.engine.round_stats
        before = len(rounds)
        self.engine.step()
        if len(rounds) != before + 1 or rounds[-1].strategy != arm or rounds[-1].batch_size != self.size:
            ran = [(str(r.strategy), r.batch_size) for r in rounds[before:]]
            raise RuntimeError(f"calibration: a step of {arm} at batch {self.size} ran {ran or 'no round'}")
        self.last = arm
        self._room -= max(rounds[-1].emitted_tokens)
        return rounds[-1]


def measure(engine: Engine, arms: list[Strategy], sizes: list[int], rounds: int, seed: int) -> CostModel:
    """Time ``rounds`` rounds (at least ``MIN_PASSES``, after a warm-up) of every arm at every batch size and context
    (``context_plans``), on engines built like ``engine``.

    The engines of all sizes and contexts are built first and take turns pass by pass, so that a slow spell of a
    shared machine falls on every size and arm alike (the ratios between them are what the bandit needs; the
    absolute level is corrected by every real round). Within a pass one engine runs all its rounds in a row after
    ``WARMUP_ROUNDS`` untimed plain ones, as a rollout does: rounds that take turns with another size's find the
    weights out of the CPU's cache (plain at batch 1 timed 1.2x slower than back to back, a ``5_1_6`` round not at
    all). Plain rounds are cheap and are the reference of every speedup estimate: each pass times ``PLAIN_REPEATS``
    of them, then every arm; a drafter arm after a round without the drafter (plain, history) first runs one untimed
    round (the drafter catches up on the tokens it missed, which would inflate that arm's time). After the arms, a
    last plain round is timed as a cold one (``CostModel.cold_measurements``: right after another arm's round, it
    costs more on a CPU). An arm slower at a size than ``max_accept_length`` plain rounds can never win there, nor
    at larger sizes: it is timed at larger sizes of that context no more. An arm's time is the median of its rounds'
    ratios to the plain rounds of the same pass times the median plain round: a load that comes and goes between
    passes cancels out of the ratios. Every point carries its context's keys a row (the median over that context's
    timed rounds). Requests are replaced by fresh ones as the context requires.
    """

    arms = _timed_arms(arms)
    rng = random.Random(seed)
    plans = context_plans(calibration_positions(engine, arms, rounds), arms, rounds)
    batches = [CalibrationBatch(engine, arms, size, plan, seed, rng) for plan in plans for size in sizes]
    times: dict[tuple[Strategy, int, RequestPlan], list[float]] = defaultdict(list)
    # a round's time over the median plain round of its pass, by (arm, size, context, whether a cold plain round)
    relative: dict[tuple[Strategy, int, RequestPlan, bool], list[float]] = defaultdict(list)
    contexts: dict[RequestPlan, list[float]] = defaultdict(list)  # keys a row of every timed round

    def learn(batch: CalibrationBatch, stats: RoundStats, cold: bool) -> None:
        plain_pass = times[(DISABLE, batch.size, batch.plan)][-PLAIN_REPEATS:]
        relative[(stats.strategy, batch.size, batch.plan, cold)].append(
            stats.wall_time_s / statistics.median(plain_pass)
        )

    for repeat in range(plans[0].passes):
        turn = repeat % max(len(arms), 1)
        order = arms[turn:] + arms[:turn]  # no arm always first or last in a pass
        for batch in batches:
            batch.start_pass()
            for arm in [DISABLE] * PLAIN_REPEATS + order:
                if arm.is_disabled or _worth_timing(times, arm, batch, sizes):
                    batch.make_room(2 * arm.max_accept_length)  # its catch-up and timed rounds
                    if arm.uses_drafter and not batch.last.uses_drafter:
                        batch.round(arm)  # the drafter reads the tokens it missed: an untimed catch-up round
                    stats = batch.round(arm)
                    if repeat > 0:
                        times[(arm, batch.size, batch.plan)].append(stats.wall_time_s)
                        contexts[batch.plan].append(stats.mean_context or 1.0)
                        learn(batch, stats, cold=False)
            if not batch.last.is_disabled:  # a plain round right after another arm's: a cold one
                batch.make_room(1)
                stats = batch.round(DISABLE)
                if repeat > 0:
                    learn(batch, stats, cold=True)
    level = {plan: max(1, round(statistics.median(keys))) for plan, keys in contexts.items()}
    if len(plans) > 1 and level[plans[-1]] < LEVEL_SPREAD * level[plans[0]]:  # too near to draw a line through
        level = {plans[-1]: level[plans[-1]]}
    points: dict[bool, list] = {False: [], True: []}  # the arms' points, the cold plain rounds'
    for (arm, size, plan, cold), ratios in relative.items():
        if plan in level:
            plain = statistics.median(times[(DISABLE, size, plan)])
            points[cold].append((arm, size, statistics.median(ratios) * plain, level[plan]))
    return CostModel.fit(points[False], cold=points[True])


def _timed_arms(arms: list[Strategy]) -> list[Strategy]:
    """The arms a calibration times besides plain decoding: each once, in order."""
    return [arm for arm in dict.fromkeys(arms) if not arm.is_disabled]


def ragged_length(longest: int, row: int, rows: int) -> int:
    """Pattern length of calibration row ``row`` of ``rows``: spread evenly from a quarter of ``longest`` to all of
    it, as a rollout batch's rows differ in length (attention runs over the longest row, which a batch of equal
    rows hides: plain rounds at batch 64 on this CPU took 12 ms with equal rows, 17 ms with the long-tail's)."""
    if rows == 1:
        return longest
    return max(1, round(longest * (0.25 + 0.75 * row / (rows - 1))))


def _worth_timing(times: dict, arm: Strategy, batch: CalibrationBatch, sizes: list[int]) -> bool:
    """False once ``arm`` was slower than ``max_accept_length`` plain rounds at a smaller size, ``batch``'s context."""
    for smaller in sizes[: sizes.index(batch.size)]:
        own, plain = times.get((arm, smaller, batch.plan)), times.get((DISABLE, smaller, batch.plan))
        if own and plain and statistics.median(own) > arm.max_accept_length * statistics.median(plain):
            return False
    return True


def _drafter_step_kernel(engine: Engine) -> bool:
    """Whether this engine's small drafter forwards run in the CPU drafter-step kernel."""
    return engine.drafter is not None and drafter_step_for(engine.runner.cache) is not None


def _drafter_shape(drafter: EagleDrafter) -> dict:
    """What a drafter step's cost depends on beyond its layer: the features it reads (a fused drafter's input is
    (len(extra_layers) + 1) x H wide) and the rows of its LM head (a draft vocabulary, or the policy's whole one)."""
    vocab = drafter.draft_vocab
    return {
        "layer": repr(drafter.config),
        "kind": type(drafter).__name__,
        "extra_layers": list(drafter.extra_layers),
        "draft_vocab": None if vocab is None else int(vocab.numel()),
    }


def calibration_positions(engine: Engine, arms: list[Strategy], rounds: int) -> int:
    """The context a calibration's rows may reach: what its long rows take over every pass (their prompt said twice
    and ``passes`` x ``pass_tokens``), rounded up to a power of two and at least ``MIN_CONTEXT``, never past the
    model's positions. Not the model's whole context, nor the engine's: every calibration engine of every size is
    alive at once, each holding its rows' whole context (a 32k-token model's would not fit a GPU), and rows never
    go past what they take."""
    positions = engine.model.config.max_position_embeddings
    plan = request_plan(positions, arms, rounds)
    reach = 2 * plan.prompt + plan.passes * plan.pass_tokens + 2
    return min(positions, max(MIN_CONTEXT, 1 << (reach - 1).bit_length()))


def calibration_key(engine: Engine, arms: list[Strategy], sizes: list[int], rounds: int) -> str:
    """What a calibration depends on: policy and drafter shapes, device, dtype, attention backend (and the drafter
    step's, the small-row linear kernel's routing, the sampler's noise kernel), threads, arms, sizes, rounds."""
    drafter = engine.drafter
    device = torch.device(engine.config.device)
    positions = calibration_positions(engine, arms, rounds)
    described = {
        "policy": dataclasses.asdict(engine.model.config),
        "drafter": None if drafter is None else _drafter_shape(drafter),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "dtype": engine.config.dtype,
        "cuda_graphs": engine.config.cuda_graphs,
        "attention": type(engine.runner.cache.backend).__name__,  # the CPU kernel or PyTorch's attention
        "drafter_step": _drafter_step_kernel(engine),  # a drafter step in one C++ call or PyTorch's ops
        # which linear products run in the small-row kernel (CPU only: a GPU engine neither builds nor uses it)
        "small_linear": small_linear_routing() if device.type == "cpu" else None,
        "uniform_bits": uniform_bits_kernel() is not None if device.type == "cpu" else None,  # the sampler's noise
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "arms": sorted(str(a) for a in arms),
        "sizes": sizes,
        "rounds": rounds,
        "prompt_tokens": PROMPT_TOKENS,
        # each context's prompt and requests' budget (one set once ran out of context and timed stale rounds)
        "requests": [dataclasses.asdict(p) for p in context_plans(positions, arms, rounds)],
        "contexts": [SHORT_PROMPT, SHORT_CONTEXT, LEVEL_SPREAD],
        "passes": MIN_PASSES,
        "order": "size by size",  # rounds of one size in a row (interleaved sizes timed plain at batch 1 1.2x slow)
        "rows": "ragged",  # rows of one batch differ in length (equal rows hid attention over the longest row)
        "cold": "plain after the arms",  # a pass ends with a plain round timed right after another arm's
        "warmup": [MIN_WARMUP_ROUNDS, WARMUP_ROUNDS, WARMUP_S],  # untimed plain rounds before a pass's timed ones
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:20]


def load_or_measure(
    engine: Engine, arms: list[Strategy], rounds: int, seed: int, cache_dir: Path | None = None
) -> CostModel:
    """The cached calibration for this engine and these arms, measured (and cached) when there is none. Engines that
    ask at once (the rollout workers of one run) measure once: the first holds a lock on the cache entry while it
    measures, the others wait for it and read what it wrote (two measuring at once on one machine would also time
    each other's load)."""
    sizes = calibration_sizes(engine.config.max_batch_size)
    path = (cache_dir or cache_root() / "calibration") / f"{calibration_key(engine, arms, sizes, rounds)}.json"
    if path.is_file():
        return _read_cache(path)
    if path.exists():  # found before the measuring, which could not be saved there
        raise ValueError(f"calibration cache {path} is not a file: remove it to measure again")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = _open_lock(path.with_suffix(".lock"))
    except OSError as err:  # a file where a directory goes, a read-only disk: before anything is measured
        raise ValueError(
            f"calibration cache {path.parent} cannot be written ({err.strerror or err}): set {CACHE_ENV} to a "
            "writable directory"
        ) from None
    with lock_file as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a measuring process dies
        if path.is_file():  # another engine measured while this one waited
            return _read_cache(path)
        timed = ", ".join(sorted({str(a) for a in arms if not a.is_disabled}))
        what = f"plain decoding and {timed}" if timed else "plain decoding"
        print(
            f"fastrl: timing rounds of {what} at batch sizes {sizes} (round costs, measured once "
            f"for this model, device and strategies; cached in {path.parent})",
            file=sys.stderr,
            flush=True,
        )
        model = measure(engine, arms, sizes, rounds, seed)
        why = implausible(model)
        if why is not None:  # a burst of load on the plain rounds every arm is timed against: once more
            print(f"fastrl: calibration looks disturbed ({why}): timing it again", file=sys.stderr, flush=True)
            model = measure(engine, arms, sizes, rounds, seed + 1)
            why = implausible(model)
        if why is not None:  # used by this run, not kept for the next (a cached one would mislead every run after)
            print(f"fastrl: calibration not cached in {path} ({why})", file=sys.stderr, flush=True)
            return model
        try:
            write_atomic(path, json.dumps(model.rows()) + "\n")
        except (OSError, ValueError) as err:  # a full disk (write_atomic says so as a ValueError): this run keeps
            # what it measured, the next measures again
            why = err.strerror if isinstance(err, OSError) and err.strerror else err
            print(f"fastrl: calibration not cached in {path} ({why})", file=sys.stderr, flush=True)
    return model


def _open_lock(lock: Path) -> IO[str]:
    """The lock file of a calibration cache entry, opened (created) for ``flock``; a ValueError naming it when it is
    not a regular file (a FIFO there hung the run in ``open``, a directory was said as an unwritable cache)."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    except OSError:
        if lock.exists() and not lock.is_file():
            raise ValueError(_not_a_lock(lock)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(_not_a_lock(lock))
    return os.fdopen(fd, "a")


def _not_a_lock(lock: Path) -> str:
    """The error of a calibration lock path that holds something other than a regular file."""
    kind = "a directory" if lock.is_dir() else "not a regular file"
    return f"calibration lock {lock} is {kind}: remove it to measure again"


def implausible(model: CostModel) -> str | None:
    """What in a calibration no machine does, or None: a drafting arm's round cheaper than a plain round of the same
    batch size and context (it runs a drafter step and a wider verify besides; a history arm, with no drafter, at
    most 10% cheaper: a round without a match is a plain one), or a plain round at a larger batch more than 20%
    cheaper than at a smaller one. A burst of load on a pass's plain rounds, which every arm is timed against, gives
    both; cached, such a calibration made every later run report a speedup of 1.8x where it measured 0.5-1.0x."""
    points = model.measurements()
    plain = {(b, c): t for s, b, t, c in points if s.is_disabled}
    for c in sorted({c for _, c in plain}, key=lambda c: -1 if c is None else c):
        times = sorted((b, t) for (b, cc), t in plain.items() if cc == c)
        for (b0, t0), (b1, t1) in zip(times, times[1:], strict=False):
            if t1 < 0.8 * t0:
                return f"plain rounds at batch {b1} timed {t1 * 1e3:.2f} ms, at batch {b0} {t0 * 1e3:.2f} ms"
    for s, b, t, c in points:
        least = 1.0 if s.uses_drafter else 0.9
        if not s.is_disabled and (b, c) in plain and t < least * plain[(b, c)]:
            return f"{s} at batch {b} timed {t * 1e3:.2f} ms, a plain round {plain[(b, c)] * 1e3:.2f} ms"
    return None


def _read_cache(path: Path) -> CostModel:
    try:
        rows = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"calibration cache {path} is unreadable ({err}): delete it to measure again") from err
    return CostModel.from_rows(rows, f"calibration cache {path} is unreadable (delete it to measure again)")


def calibrate_engine(engine: Engine, cache_dir: Path | None = None, meter: bool = True) -> CostModel | None:
    """Give the engine's bandit (when it has one) its drafter's held-out acceptance as the prior of its drafting
    arms, and (when it wants a calibration and has none) its round costs: its arms', and those of the fixed chains
    that time its stopping chains by depth (``timing_chains``). Another selector that speculates (a fixed strategy,
    the EMA tiers) gets, with ``meter``, a ``PlainTimeMeter`` over the same calibration of its arms, so its rounds
    carry a plain-decoding estimate too."""
    selector = engine.selector
    if not isinstance(selector, BanditSelector):
        arms = [arm for arm in selector.strategies if not arm.is_disabled]
        if not meter or not arms or hasattr(selector, "plain_time_estimate"):
            return None
        calibration = load_or_measure(engine, arms + timing_chains(arms), METER_ROUNDS, 0, cache_dir)
        engine.plain_meter = PlainTimeMeter(calibration)
        return calibration
    if engine.drafter is not None and engine.drafter.prior_hazard is not None:
        selector.set_prior_hazard(engine.drafter.prior_hazard)
    if not selector.config.calibrate:
        return None
    if selector.times.calibration() is None:
        config, arms = selector.config, selector.strategies
        timed = arms + timing_chains(arms)  # the fixed chains that time a stopping chain at the depth it reaches
        selector.set_calibration(load_or_measure(engine, timed, config.min_pulls, config.seed, cache_dir))
    return selector.times.calibration()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"
