"""The calibration's requests fit the model's context: every round it times is a fresh round of the arm it meant,
over the whole batch (requests sized for every pass at once ran out of context on a short model, and the calibration
then timed whatever round had come last)."""

from __future__ import annotations

import itertools

import pytest

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine import calibration
from fastrl.engine.calibration import (
    LEVEL_SPREAD,
    MIN_CONTEXT,
    MIN_PASSES,
    MIN_WARMUP_ROUNDS,
    PROMPT_TOKENS,
    SHORT_CONTEXT,
    SHORT_PROMPT,
    WARMUP_ROUNDS,
    calibration_key,
    calibration_positions,
    context_plans,
    request_plan,
)
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import DISABLE, Strategy
from tests.rl.grpo_setup import tiny_policy

ARMS = [Strategy.parse("3_1_4"), Strategy.parse("suffix_4")]


class RecordingEngine(Engine):
    """An Engine that records, for every step, whether requests waited (a prefill), what its selector meant to run
    and the rounds it ran."""

    steps: list[tuple[bool, Strategy, int, list]] = []

    def step(self):
        prefill = bool(self.scheduler.waiting)
        before = len(self.round_stats)
        outputs = super().step()
        type(self).steps.append((prefill, self.selector.next, self.config.max_batch_size, self.round_stats[before:]))
        return outputs


def test_many_rounds_on_a_short_context_time_only_fresh_rounds_of_the_whole_batch(monkeypatch):
    policy = tiny_policy()  # 128 positions: one pass of these arms, no more, after the prompt
    drafter = EagleDrafter(policy.config).eval()
    engine = Engine(policy, EngineConfig(max_batch_size=3), drafter, FixedSelector("3_1_4"))
    every_arm_timed(monkeypatch)
    monkeypatch.setattr(RecordingEngine, "steps", [])
    monkeypatch.setattr(calibration, "Engine", RecordingEngine)
    model = calibration.measure(engine, ARMS, [1, 3], rounds=30, seed=0)
    steps = RecordingEngine.steps
    bad = [
        (str(meant), size, [(str(r.strategy), r.batch_size) for r in ran])
        for prefill, meant, size, ran in steps
        if not prefill and ran_wrong(meant, size, ran)
    ]
    assert not bad, f"steps that ran no round, or another one: {bad[:5]}"
    prefills = [(size, len(ran)) for prefill, _, size, ran in steps if prefill]
    plan = request_plan(policy.config.max_position_embeddings, ARMS, 30)
    assert plan.pass_tokens <= plan.budget - 1 < 2 * plan.pass_tokens and plan.passes == 31  # one pass a set, no more
    assert sorted(prefills) == [(1, 0)] * 31 + [(3, 0)] * 31  # each set prefilled in a step of its own
    assert {(str(s), b) for s, b, *_ in model.measurements()} == {(str(a), b) for a in [*ARMS, DISABLE] for b in (1, 3)}
    cold = [ran[0] for prefill, meant, _, ran in steps if not prefill and meant.is_disabled and ran[0].after_other_arm]
    assert len(cold) == 2 * 31  # every pass ends with a plain round right after another arm's, at each size
    assert sorted(b for _, b, *_ in model.cold_measurements()) == [1, 3]
    rounds = [r for prefill, _, _, ran in steps if not prefill for r in ran]
    for size in (1, 3):  # the engine says which rounds followed another arm's (each size's engine its own rounds)
        own = [r for r in rounds if r.batch_size == size]
        assert [r.after_other_arm for r in own[1:]] == [
            a.strategy != b.strategy for a, b in zip(own[:-1], own[1:], strict=True)
        ]
        runs = [len(list(run)) for plain, run in itertools.groupby(own, key=lambda r: r.strategy.is_disabled) if plain]
        # a pass's warm-up (MIN_WARMUP_ROUNDS to WARMUP_ROUNDS) and 3 timed plain rounds, after the last pass's cold one
        assert MIN_WARMUP_ROUNDS + 3 <= runs[0] <= WARMUP_ROUNDS + 3 and runs[-1] == 1 and len(runs) == 32
        assert all(1 + MIN_WARMUP_ROUNDS + 3 <= n <= 1 + WARMUP_ROUNDS + 3 for n in runs[1:-1])


def test_a_context_shorter_than_a_pass_replaces_requests_within_passes(monkeypatch):
    """The train defaults' nine arms need 130 tokens a pass: on a 128-position model the calibration was refused;
    fresh requests now come before any arm the running ones could not take."""
    policy = tiny_policy()
    drafter = EagleDrafter(policy.config).eval()
    names = ("12_1_13@0.3", "7_1_8", "5_1_6", "3_1_4", "8_4_32", "suffix_8", "3_1_4+suffix_8", "1_1_2", "2_1_3")
    arms = [Strategy.parse(a) for a in names]
    plan = request_plan(policy.config.max_position_embeddings, arms, 3)
    assert plan.pass_tokens > plan.budget and plan.context <= policy.config.max_position_embeddings
    model = measured_whole_batches(monkeypatch, policy, drafter, arms)
    assert {str(s) for s, *_ in model.measurements()} == {str(a) for a in [*arms, DISABLE]}


def measured_whole_batches(monkeypatch, policy, drafter, arms: list[Strategy]):
    """The calibration of ``arms`` at batch sizes 1 and 2 (3 rounds), checked to have run every round it meant over
    the whole batch."""
    engine = Engine(policy, EngineConfig(max_batch_size=2), drafter, FixedSelector("3_1_4"))
    every_arm_timed(monkeypatch)
    monkeypatch.setattr(RecordingEngine, "steps", [])
    monkeypatch.setattr(calibration, "Engine", RecordingEngine)
    model = calibration.measure(engine, arms, [1, 2], rounds=3, seed=0)
    bad = [
        (str(meant), size)
        for prefill, meant, size, ran in RecordingEngine.steps
        if not prefill and ran_wrong(meant, size, ran)
    ]
    assert not bad, f"steps that ran no round, or another one: {bad[:5]}"
    return model


def every_arm_timed(monkeypatch) -> None:
    """No arm left untimed at a larger size for having been slow at a smaller one (``_worth_timing`` goes by wall
    times: under a loaded machine's noise it dropped arms these tests expect measured everywhere)."""
    monkeypatch.setattr(calibration, "_worth_timing", lambda *args: True)


def ran_wrong(meant: Strategy, size: int, ran: list) -> bool:
    """Whether a step meant to run one round of ``meant`` over ``size`` rows ran anything else."""
    return len(ran) != 1 or ran[0].strategy != meant or ran[0].batch_size != size


def test_the_plan_keeps_the_prompt_where_a_pass_fits_and_gives_the_rest_to_the_budget():
    """A pass of 3_1_4 and suffix_4 emits at most 36 tokens a row (up to 16 untimed plain rounds, 3 timed and a cold
    one, each arm twice its longest round)."""
    plan = request_plan(1024, ARMS, 1000)
    assert (plan.prompt, plan.pass_tokens, plan.passes) == (PROMPT_TOKENS, WARMUP_ROUNDS + 3 + 1 + 8 + 8, 1001)
    assert plan.context == 1024  # the rest of the context is the budget: a set of requests takes many passes
    assert request_plan(1024, ARMS, 3).passes == MIN_PASSES + 1
    short = request_plan(56, ARMS, 3)
    assert short.prompt == 9 and short.budget - 1 >= short.pass_tokens and short.context <= 56  # room for a pass
    shorter = request_plan(22, ARMS, 3)  # no room for a whole pass after any prompt: room for its largest step
    assert shorter.pass_tokens > shorter.budget - 1 >= 8 and shorter.context <= 22
    assert shorter.warmup == shorter.budget - 2 - 3 < WARMUP_ROUNDS and plan.warmup == WARMUP_ROUNDS  # what fits


def test_a_context_shorter_than_one_arms_rounds_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"context of 11 positions cannot hold the rounds .* \(needs 12"):
        request_plan(11, ARMS, 3)
    assert request_plan(12, ARMS, 3).prompt == 1 and request_plan(12, ARMS, 3).warmup >= MIN_WARMUP_ROUNDS


def test_a_long_enough_model_is_timed_at_a_short_and_a_long_context(monkeypatch):
    """Rows of a task prompt's length and rows of hundreds of keys: every point carries its context's keys a row,
    the short one within ``SHORT_CONTEXT`` and the long one ``LEVEL_SPREAD`` times as long at least."""
    policy = tiny_policy(positions=512)
    drafter = EagleDrafter(policy.config).eval()
    short, long = context_plans(512, ARMS, 3)
    assert short.prompt == SHORT_PROMPT and short.context <= SHORT_CONTEXT and long.prompt > short.context
    assert context_plans(128, ARMS, 3) == [request_plan(128, ARMS, 3)]  # no room for a long context
    engine = Engine(policy, EngineConfig(max_batch_size=4), drafter, FixedSelector("3_1_4"))
    every_arm_timed(monkeypatch)
    monkeypatch.setattr(RecordingEngine, "steps", [])
    monkeypatch.setattr(calibration, "Engine", RecordingEngine)
    model = calibration.measure(engine, ARMS, [1, 4], rounds=3, seed=0)
    bad = [(str(m), size) for prefill, m, size, ran in RecordingEngine.steps if not prefill and ran_wrong(m, size, ran)]
    assert not bad, f"steps that ran no round, or another one: {bad[:5]}"
    points = model.measurements()
    contexts = sorted({c for *_, c in points})
    assert len(contexts) == 2 and contexts[0] <= SHORT_CONTEXT and contexts[1] >= LEVEL_SPREAD * contexts[0]
    want = {(str(a), b, c) for a in [*ARMS, DISABLE] for b in (1, 4) for c in contexts}
    assert {(str(s), b, c) for s, b, _, c in points} == want


@pytest.mark.parametrize("positions", [12, 17, 30])
def test_a_model_of_a_few_dozen_positions_is_calibrated_with_the_warm_up_that_fits(monkeypatch, positions):
    """A context too short for ``WARMUP_ROUNDS`` untimed plain rounds gets fewer (at least ``MIN_WARMUP_ROUNDS``), and
    every round the calibration meant still runs over the whole batch."""
    policy = tiny_policy(positions=positions)
    drafter = EagleDrafter(policy.config).eval()
    model = measured_whole_batches(monkeypatch, policy, drafter, ARMS)
    assert {(str(s), b) for s, b, *_ in model.measurements()} == {(str(a), b) for a in [*ARMS, DISABLE] for b in (1, 2)}
    assert MIN_WARMUP_ROUNDS <= request_plan(positions, ARMS, 3).warmup < WARMUP_ROUNDS


def test_a_full_disk_keeps_the_measured_calibration(monkeypatch, tmp_path, capsys):
    """write_atomic says a full disk as a ValueError, which the cache's `except OSError` let through: the run failed
    after its minutes of measuring, where the code meant to keep what it measured and cache it next time."""
    import errno
    from pathlib import Path

    from fastrl.adaptive.cost_model import CostModel

    measured = CostModel.fit([(DISABLE, 1, 0.01, 30), (Strategy.parse("3_1_4"), 1, 0.02, 30)])
    monkeypatch.setattr(calibration, "calibration_key", lambda *args: "k")
    monkeypatch.setattr(calibration, "measure", lambda *args: measured)
    real = Path.write_bytes

    def full_disk(self: Path, data: bytes) -> int:
        if self.parent == tmp_path:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)

    class Engine:
        class config:  # noqa: N801 (the engine's config, as load_or_measure reads it)
            max_batch_size = 8

    model = calibration.load_or_measure(Engine(), [Strategy.parse("3_1_4")], 3, 0, tmp_path)
    assert model.rows() == measured.rows()
    assert "calibration not cached" in capsys.readouterr().err and not (tmp_path / "k.json").exists()


def test_the_calibration_engines_hold_what_their_rows_reach_not_the_models_context(monkeypatch):
    """They were sized by the model's whole context (32k positions for a real model, every engine of every size
    alive at once: hundreds of GB of KV pools on a GPU); rows reach their prompt said twice and every pass's tokens,
    so that (rounded up to a power of two, at least MIN_CONTEXT) is what they hold, whatever the engine's own."""
    policy = tiny_policy(positions=32768)
    drafter = EagleDrafter(policy.config).eval()

    def engine_of(context: int | None) -> Engine:
        return Engine(policy, EngineConfig(max_batch_size=4, max_model_len=context), drafter, FixedSelector("3_1_4"))

    reach = calibration_positions(engine_of(None), ARMS, 3)
    plan = request_plan(32768, ARMS, 3)
    assert MIN_CONTEXT <= reach < 4 * (2 * plan.prompt + plan.passes * plan.pass_tokens + MIN_CONTEXT)
    assert all(calibration_positions(engine_of(c), ARMS, 3) == reach for c in (100, 4096, None))  # one cache key
    assert calibration_key(engine_of(100), ARMS, [1, 4], 3) == calibration_key(engine_of(None), ARMS, [1, 4], 3)
    every_arm_timed(monkeypatch)
    monkeypatch.setattr(RecordingEngine, "steps", [])
    built: list[int] = []

    class Recorded(RecordingEngine):
        def __init__(self, model, config, *args, **kwargs):
            built.append(config.max_model_len)
            super().__init__(model, config, *args, **kwargs)

    monkeypatch.setattr(calibration, "Engine", Recorded)
    model = calibration.measure(engine_of(None), ARMS, [1, 4], rounds=3, seed=0)
    assert built and max(built) <= reach
    assert {(str(s), b) for s, b, *_ in model.measurements()} == {(str(a), b) for a in [*ARMS, DISABLE] for b in (1, 4)}


def test_an_arm_slower_than_its_accept_length_of_plain_rounds_is_not_timed_at_larger_sizes():
    """It can never win there, nor at larger sizes (``_worth_timing``)."""
    from types import SimpleNamespace

    plan, arm = request_plan(512, ARMS, 3), Strategy.parse("3_1_4")
    plain = {(DISABLE, 1, plan): [0.01] * 3}
    at = SimpleNamespace(size=4, plan=plan)
    slow = {**plain, (arm, 1, plan): [0.01 * arm.max_accept_length * 1.01] * 3}
    fast = {**plain, (arm, 1, plan): [0.01 * arm.max_accept_length * 0.99] * 3}
    assert not calibration._worth_timing(slow, arm, at, [1, 4]) and calibration._worth_timing(fast, arm, at, [1, 4])
    assert calibration._worth_timing(slow, arm, SimpleNamespace(size=1, plan=plan), [1, 4])  # the smallest always


def test_a_disturbed_calibration_is_timed_again_and_never_cached(monkeypatch, tmp_path, capsys):
    """A burst of load on a pass's plain rounds (every arm is timed against them) left a calibration where 1_1_2 cost
    less than a plain round; cached, it made every later run report a speedup of ~1.8x where plain and the bandit
    ran alike. Such a calibration is timed again, and used but not cached if it still looks so."""
    from fastrl.adaptive.cost_model import CostModel
    from fastrl.engine.calibration import implausible

    chain, suffix = Strategy.parse("1_1_2"), Strategy.parse("suffix_8")

    def model(chain_s: float, plain_8: float = 0.012, suffix_s: float = 0.011) -> CostModel:
        points = [
            (DISABLE, 1, 0.010),
            (DISABLE, 8, plain_8),
            (chain, 1, chain_s),
            (chain, 8, 0.02),
            (suffix, 1, suffix_s),
        ]
        return CostModel.fit(points)

    assert implausible(model(0.013)) is None
    assert implausible(model(0.013, suffix_s=0.0095)) is None  # a history round with no match is a plain one
    assert "1_1_2 at batch 1 timed 9.50 ms, a plain round 10.00 ms" in implausible(model(0.0095))
    assert "plain rounds at batch 8 timed 7.00 ms, at batch 1 10.00 ms" in implausible(model(0.013, plain_8=0.007))
    assert "suffix_8" in implausible(model(0.013, suffix_s=0.0085))
    monkeypatch.setattr(calibration, "calibration_key", lambda *args: "k")

    class Engine:
        class config:  # noqa: N801 (the engine's config, as load_or_measure reads it)
            max_batch_size = 8

    for measured, cached in (([model(0.0095), model(0.013)], True), ([model(0.0095), model(0.009)], False)):
        (tmp_path / "k.json").unlink(missing_ok=True)
        monkeypatch.setattr(calibration, "measure", lambda *args, queue=list(measured): queue.pop(0))
        got = calibration.load_or_measure(Engine(), [chain, suffix], 3, 0, tmp_path)
        assert got.rows() == measured[-1].rows() and (tmp_path / "k.json").exists() == cached
        assert "timing it again" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_path_that_is_no_regular_file_is_one_error_naming_it(monkeypatch, tmp_path, kind):
    """A FIFO at a calibration's .lock hung the run forever in open(); a directory there was said as an unwritable
    cache directory."""
    import os
    import signal

    monkeypatch.setattr(calibration, "calibration_key", lambda *args: "k")
    monkeypatch.setattr(calibration, "measure", lambda *args: pytest.fail("measured without its lock"))
    lock = tmp_path / "k.lock"
    if kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()

    class Engine:
        class config:  # noqa: N801 (the engine's config, as load_or_measure reads it)
            max_batch_size = 8

    def hung(*args: object) -> None:
        raise TimeoutError(f"load_or_measure hung on {lock}")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(ValueError) as raised:
            calibration.load_or_measure(Engine(), [Strategy.parse("3_1_4")], 3, 0, tmp_path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    said = "a directory" if kind == "directory" else "not a regular file"
    assert str(raised.value) == f"calibration lock {lock} is {said}: remove it to measure again"
