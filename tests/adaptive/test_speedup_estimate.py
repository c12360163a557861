"""Every run measures its own speedup: the plain-decoding time the bandit estimates for a speculative run's rounds
against a real plain run of the same requests, and the calibration cache."""

import json
import statistics
import time

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.factory import build_selector
from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.long_tail import run_lockstep
from fastrl.bench.workload import task_prompts
from fastrl.engine.calibration import calibrate_engine
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.round_stats import RoundTotals
from fastrl.strategy.strategy import DISABLE

REQUESTS, NEW_TOKENS, REPEATS = 16, 128, 5


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir())
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


SELECTORS = {
    "bandit": lambda: BanditSelector(BanditConfig(strategies=["3_1_4"])),
    "fixed": lambda: FixedSelector("3_1_4"),  # a PlainTimeMeter estimates for it
    "ema": lambda: build_selector("ema"),
}


def _estimate_ratios(models, cache_dir, repeats: int, kind: str = "bandit") -> list[float]:
    """Estimated plain time of a speculative run over the real time of a plain run of the same requests, once per
    repeat. Every round speculates (the bandit's one arm is 3_1_4, the fixed strategy is, the EMA tiers are chains),
    so the estimate is the plain cost model alone; the plain engine steps in lockstep with it (a shared machine's load
    falls on both alike)."""
    policy, drafter = models
    prompts = task_prompts(load_tokenizer(bundled_model_dir()), REQUESTS, 0)
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=i))
        for i, p in enumerate(prompts)
    ]
    config = EngineConfig(max_batch_size=REQUESTS, max_model_len=512)
    ratios = []
    for _ in range(repeats):
        spec = Engine(policy, config, drafter=drafter, selector=SELECTORS[kind]())
        calibrate_engine(spec, cache_dir)  # measured once, then read from cache_dir
        plain = Engine(policy, config, selector=FixedSelector(DISABLE))
        _, outputs = run_lockstep({"plain": plain, "spec": spec}, inputs)
        assert [o.token_ids for o in outputs["plain"]] == [o.token_ids for o in outputs["spec"]]
        totals = RoundTotals.of(spec.round_stats)
        assert totals.estimated_rounds == totals.rounds > 0 and all(
            not s.strategy.is_disabled for s in spec.round_stats
        )
        ratios.append(totals.plain_time_estimate_s / sum(s.wall_time_s for s in plain.round_stats))
        assert totals.estimated_speedup == pytest.approx(totals.plain_time_estimate_s / totals.wall_time_s)
    assert len(list(cache_dir.glob("*.json"))) == 1  # one calibration, cached and reused
    return ratios


@pytest.mark.parametrize("kind", sorted(SELECTORS))
def test_every_speculative_round_carries_a_plain_time_estimate(models, tmp_path, kind):
    assert all(r > 0 for r in _estimate_ratios(models, tmp_path, repeats=2, kind=kind))


@pytest.mark.timing
@pytest.mark.parametrize("kind", ["bandit", "fixed"])
def test_estimated_plain_time_matches_a_real_plain_run(models, tmp_path, kind):
    """The estimate within 10% of a real plain run (median over repeats). A wall-clock bound, so it is opt-in
    (`python -m pytest -m timing`, on a machine nothing else loads): calibration and run must see the same load."""
    ratios = _estimate_ratios(models, tmp_path, REPEATS, kind)
    assert abs(statistics.median(ratios) - 1.0) <= 0.10, ratios


def test_plain_rounds_estimate_themselves_and_an_uncalibrated_fixed_strategy_makes_no_estimate(models, tmp_path):
    policy, drafter = models
    inputs = [GenerateInput([5, 6, 7, 8], SamplingParams(max_new_tokens=8, seed=i)) for i in range(2)]
    plain = Engine(policy, EngineConfig(max_batch_size=2, max_model_len=64))
    plain.generate(inputs)
    assert all(s.plain_time_estimate_s == s.wall_time_s for s in plain.round_stats)
    assert RoundTotals.of(plain.round_stats).estimated_speedup == pytest.approx(1.0)
    fixed = Engine(policy, EngineConfig(max_batch_size=2, max_model_len=64), drafter, FixedSelector("3_1_4"))
    fixed.generate(inputs)
    assert RoundTotals.of(fixed.round_stats).estimated_speedup is None
    assert calibrate_engine(fixed, tmp_path, meter=False) is None and fixed.plain_meter is None
    assert not list(tmp_path.glob("*.json"))  # nothing measured for it


def test_calibration_cache_is_keyed_and_unreadable_cache_is_an_error(models, tmp_path, capsys):
    policy, drafter = models
    config = EngineConfig(max_batch_size=2, max_model_len=64)
    engine = Engine(policy, config, drafter, BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], min_pulls=1)))
    calibration = calibrate_engine(engine, tmp_path)
    (said,) = capsys.readouterr().err.splitlines()  # a measurement says what it times, and where it keeps it
    assert said.startswith("fastrl: timing rounds of plain decoding and 3_1_4 at batch sizes [1, 2]")
    assert str(tmp_path) in said
    cached = Engine(policy, config, drafter, BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], min_pulls=1)))
    calibrate_engine(cached, tmp_path)
    assert capsys.readouterr().err == ""  # read from the cache: nothing to say
    assert {str(s) for s in calibration.measured_strategies} == {"3_1_4", "disable"}
    assert {b for _, b, _, _ in calibration.measurements()} == {1, 2}
    (path,) = tmp_path.glob("*.json")
    other = Engine(policy, config, drafter, BanditSelector(BanditConfig(strategies=["5_1_6", "disable"], min_pulls=1)))
    calibrate_engine(other, tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 2  # other arms, another key
    rows = json.loads(path.read_text())
    damaged = [
        "{not json",
        json.dumps([[s, b, float("inf") if i == 0 else t, *c] for i, (s, b, t, *c) in enumerate(rows)]),  # ZeroDivision
        json.dumps([[s, float("inf") if i == 0 else b, t, *c] for i, (s, b, t, *c) in enumerate(rows)]),  # Overflow
        json.dumps([[s, 1.5, t, *c] for s, _, t, *c in rows]),  # read as batch size 1 before
        json.dumps([[s, b, t, 0.5] for s, b, t, *_ in rows]),  # a context of half a key a row
    ]
    for text in damaged:
        path.write_text(text)
        again = Engine(
            policy, config, drafter, BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], min_pulls=1))
        )
        with pytest.raises(ValueError, match="calibration cache .* unreadable"):
            calibrate_engine(again, tmp_path)
    path.unlink()
    capsys.readouterr()
    path.mkdir()  # refused before the measuring, which used to end in an IsADirectoryError
    with pytest.raises(ValueError, match="calibration cache .* is not a file: remove it"):
        calibrate_engine(again, tmp_path)
    assert capsys.readouterr().err == ""  # nothing measured
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")  # $FASTRL_CACHE at a file: a NotADirectoryError's traceback, after the load
    with pytest.raises(ValueError, match=r"calibration cache .*file/calibration cannot be written \(Not a directory"):
        calibrate_engine(again, not_a_directory / "calibration")
    assert capsys.readouterr().err == ""
    off = Engine(policy, config, drafter, BanditSelector(BanditConfig(strategies=["3_1_4"], calibrate=False)))
    assert calibrate_engine(off, tmp_path) is None


def test_calibration_key_tells_drafters_of_one_layer_apart(models):
    """A drafter step costs more with a wider input (a fused drafter reads (len(extra_layers) + 1) x H) and less with
    a draft vocabulary (fewer LM-head rows): drafters that share their decoder layer's config get their own key."""
    import torch

    from fastrl.engine.calibration import calibration_key
    from fastrl.speculative.drafter import EagleDrafter

    policy, shipped = models
    config = EngineConfig(max_batch_size=2, max_model_len=64)
    arms = [DISABLE]

    def key(drafter) -> str:
        return calibration_key(Engine(policy, config, drafter, FixedSelector("3_1_4")), arms, [1, 2], 3)

    last = EagleDrafter(policy.config).eval()
    narrow = EagleDrafter(policy.config).eval()
    narrow.set_draft_vocab(torch.arange(32))
    assert shipped.extra_layers and repr(last.config) == repr(shipped.config)  # one layer config, three drafters
    keys = [key(shipped), key(last), key(narrow)]
    assert len(set(keys)) == 3
    assert key(EagleDrafter(policy.config).eval()) == keys[1]  # the same shapes, the same key


def test_an_engine_with_a_small_kv_pool_calibrates(models, tmp_path):
    """The calibration's engines hold every row's whole context: their pool is theirs, not a copy of the engine's
    kv_cache_tokens (a pool that fits the engine made building the bandit's engine fail)."""
    policy, drafter = models
    config = EngineConfig(max_batch_size=9, max_model_len=80, kv_cache_tokens=160)
    engine = Engine(policy, config, drafter, BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], min_pulls=1)))
    calibration = calibrate_engine(engine, tmp_path)
    assert calibration is not None and {str(s) for s in calibration.measured_strategies} == {"3_1_4", "disable"}


def test_workers_calibrating_at_once_measure_once(models, tmp_path, monkeypatch):
    """The rollout workers of one run calibrate at the same time: the first measures while the others wait on the
    cache entry's lock, then read what it wrote (before, every worker measured, on a shared machine each timing the
    others' load, and all wrote the same path through one temporary name)."""
    import threading

    from fastrl.adaptive.cost_model import CostModel
    from fastrl.engine import calibration
    from fastrl.strategy.strategy import Strategy

    policy, drafter = models
    engine = Engine(policy, EngineConfig(max_batch_size=2, max_model_len=64), drafter, FixedSelector("3_1_4"))
    arm = Strategy.parse("3_1_4")
    model = CostModel.fit([(DISABLE, 1, 0.01), (arm, 1, 0.02), (DISABLE, 2, 0.012), (arm, 2, 0.025)])
    calls, start = [], threading.Barrier(8)

    def measured(*_):
        calls.append(1)
        time.sleep(0.2)  # a measurement takes a while: the other workers arrive meanwhile
        return model

    monkeypatch.setattr(calibration, "measure", measured)
    got, errors = [], []

    def calibrate():
        try:
            start.wait(timeout=60)
            got.append(calibration.load_or_measure(engine, [arm], 3, 0, tmp_path).measurements())
        except Exception as err:  # noqa: BLE001 - any failure of a worker is the finding
            errors.append(err)

    threads = [threading.Thread(target=calibrate) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1
    assert got == [model.measurements()] * 8
    assert [p.suffix for p in sorted(tmp_path.iterdir())] == [".json", ".lock"]  # no temporary file left
