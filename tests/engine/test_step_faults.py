"""A step that raises loses nothing and leaves the engine able to go on: after a selector's observe failed (requests
had progressed) or a fault inside a round (the drafter's input taken, the history drafted, the verify forward), the
exception reaches the caller, the next step returns what had progressed, and the streamed tokens and finished outputs
equal an undisturbed run's, for any strategy and wherever the failures fall."""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import signal

import pytest
import torch

import fastrl.engine.runner as runner_module
import fastrl.speculative.round as round_module
from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.runner import ModelRunner
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.history.index import HistoryIndex
from fastrl.strategy.round_stats import RoundStats


class _FlakySelector(FixedSelector):
    """A fixed strategy whose observation raises on the listed rounds (0-based)."""

    def __init__(self, strategy: str, failing: set[int]) -> None:
        super().__init__(strategy)
        self.failing = failing
        self.rounds = 0

    def observe(self, stats: RoundStats) -> None:
        self.rounds += 1
        if self.rounds - 1 in self.failing:
            raise RuntimeError(f"observe failed at round {self.rounds - 1}")


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir()).eval()
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


def _inputs(rng: random.Random, count: int) -> list[GenerateInput]:
    return [
        GenerateInput(
            [1, *(rng.randrange(3, 40) for _ in range(rng.randint(2, 12)))],
            SamplingParams(max_new_tokens=rng.randint(1, 30), temperature=rng.choice([0.0, 1.0]), seed=i),
        )
        for i in range(count)
    ]


def _run_through_faults(engine: Engine, inputs: list[GenerateInput], message: str) -> tuple[dict, dict, int]:
    """Step to the end, catching each injected fault; (streamed tokens, final outputs, faults) by request id."""
    ids = [engine.add_request(i.prompt_ids, i.params) for i in inputs]
    streamed: dict[str, list[int]] = {i: [] for i in ids}
    final = {}
    raised = 0
    while engine.has_unfinished():
        try:
            outputs = engine.step()
        except RuntimeError as error:
            assert message in str(error)
            raised += 1
            assert raised < 100, "the engine does not get past the fault"
            continue
        for out in outputs:
            streamed[out.request_id] += out.new_token_ids
            assert out.request_id not in final, f"{out.request_id} reported after it finished"
            if out.finished:
                final[out.request_id] = out
    return {i: streamed[i] for i in ids}, {i: final[i] for i in ids}, raised


def _assert_as_reference(streamed: dict, final: dict, reference: list, logprob_tolerance: float = 0.0) -> None:
    for (rid, out), ref in zip(final.items(), reference, strict=True):
        assert out.token_ids == ref.token_ids == streamed[rid], rid
        assert out.finish_reason == ref.finish_reason
        assert len(out.logprobs) == len(ref.logprobs)
        assert (
            max((abs(a - b) for a, b in zip(out.logprobs, ref.logprobs, strict=True)), default=0.0) <= logprob_tolerance
        )


@pytest.mark.parametrize("strategy", ["disable", "3_1_4", "3_1_4+suffix_8"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_raising_observe_loses_no_output(models, strategy, seed):
    policy, drafter = models
    rng = random.Random(seed)
    inputs = _inputs(rng, 7)
    config = EngineConfig(max_batch_size=3, max_model_len=128)
    reference = Engine(policy, config, drafter, FixedSelector(strategy)).generate(inputs)
    failing = set(rng.sample(range(24), 10))  # consecutive failures too, and ones where requests finish
    engine = Engine(policy, config, drafter, _FlakySelector(strategy, failing))
    streamed, final, raised = _run_through_faults(engine, inputs, "observe failed")
    assert raised == len([r for r in failing if r < engine.selector.rounds]) > 0
    _assert_as_reference(streamed, final, reference)


FAULTS = {
    "verify": (round_module, "verify_trees"),
    "history": (HistoryIndex, "draft"),
    "prefill": (ModelRunner, "prefill"),
    "resume": (ModelRunner, "resume"),
    "prefill forward": (runner_module, "prefill_shared"),  # inside the runner's prefill: its pages are synced
    "recompute forward": (runner_module, "prefill"),
    "read back": (runner_module, "unpack"),  # after the round's end advanced the device state
}


@pytest.mark.parametrize(
    "strategy, where",
    [
        ("3_1_4", "verify"),
        ("8_4_32", "verify"),
        ("3_1_4+suffix_8", "history"),
        ("suffix_8", "verify"),
        ("disable", "prefill"),
        ("3_1_4", "prefill"),
        ("3_1_4", "resume"),
        ("disable", "resume"),
        ("disable", "read back"),
        ("3_1_4", "read back"),
        ("8_4_32", "read back"),
        ("3_1_4+suffix_8", "read back"),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_fault_in_a_prefill_or_a_round_leaves_the_engine_going(models, monkeypatch, strategy, where, seed):
    """A prefill (or a preempted request's recompute) that raises leaves its requests waiting to be admitted again;
    a round that raises leaves its requests where they were. Tight pools make the recomputes happen."""
    policy, drafter = models
    rng = random.Random(seed)
    inputs = _inputs(rng, 6)
    tight = where == "resume"
    config = EngineConfig(max_batch_size=3, page_size=4, max_model_len=40 if tight else 128)
    reference = Engine(policy, config, drafter, FixedSelector(strategy)).generate(inputs)
    if tight:  # room for one request and a bit: three running ones preempt each other
        config = dataclasses.replace(config, kv_cache_tokens=48)
    owner, name = FAULTS[where]
    original = getattr(owner, name)
    failing = {0, rng.randrange(1, 3)} if tight else set(rng.sample(range(30), 8))  # recomputes are few
    calls = [0]

    def faulty(*args, **kwargs):
        calls[0] += 1
        if calls[0] - 1 in failing:
            raise RuntimeError(f"injected fault in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, faulty)
    engine = Engine(policy, config, drafter, FixedSelector(strategy))
    streamed, final, raised = _run_through_faults(engine, inputs, "injected fault")
    assert raised == len([c for c in failing if c < calls[0]]) > 0
    # a recompute's keys come from a prefill, and a round that failed (before its end or after it) is run again
    # beside the requests the failed step admitted, which an undisturbed run decodes from the next round on: other
    # batch compositions, so float32 log-probs move by ulps where the CPU's matmuls depend on the row count (AVX-512
    # does at these shapes); float64 shows it is rounding only (test_a_round_fault_moves_log_probs_by_rounding_only)
    moved = tight or where in ("read back", "verify", "history")
    _assert_as_reference(streamed, final, reference, logprob_tolerance=1e-5 if moved else 0.0)
    if tight:
        assert engine.scheduler.preemptions > 0


@pytest.mark.parametrize("strategy", ["3_1_4", "suffix_8"])
def test_a_round_fault_moves_log_probs_by_rounding_only(models, monkeypatch, strategy):
    """In float64 a verify forward that fails in the step that admitted a request (which then joins the retried
    round, a batch the undisturbed run never formed) gives the same tokens and log-probs within 1e-12."""
    policy, drafter = (m.to(torch.float64) for m in copy.deepcopy(models))
    rng = random.Random(0)
    inputs = _inputs(rng, 6)
    config = EngineConfig(max_batch_size=3, page_size=4, max_model_len=128, dtype="float64")
    reference = Engine(policy, config, drafter, FixedSelector(strategy)).generate(inputs)
    failing = set(rng.sample(range(30), 8))
    original, calls = round_module.verify_trees, [0]

    def faulty(*args, **kwargs):
        calls[0] += 1
        if calls[0] - 1 in failing:
            raise RuntimeError("injected fault in verify_trees")
        return original(*args, **kwargs)

    monkeypatch.setattr(round_module, "verify_trees", faulty)
    engine = Engine(policy, config, drafter, FixedSelector(strategy))
    streamed, final, raised = _run_through_faults(engine, inputs, "injected fault")
    assert raised > 0
    _assert_as_reference(streamed, final, reference, logprob_tolerance=1e-12)


def test_an_id_stays_taken_until_its_final_output_is_returned(models):
    """A request that finished in a step that raised is reported by the next step: until then its id cannot be
    queued again, and generate() refuses to run (it would take the output and drop it)."""
    policy, drafter = models
    engine = Engine(policy, EngineConfig(max_batch_size=2, max_model_len=64), drafter, _FlakySelector("3_1_4", {0}))
    params = SamplingParams(max_new_tokens=1 + 1, temperature=0.0)
    engine.add_request([1, 5, 6], params, "mine")
    with pytest.raises(RuntimeError, match="observe failed"):
        while True:
            engine.step()
    with pytest.raises(ValueError, match="'mine' has finished in this engine, but its output comes with the next"):
        engine.add_request([1, 5, 6], params, "mine")
    with pytest.raises(ValueError, match="requests queued with add_request are still running"):
        engine.generate([GenerateInput([1, 7], params)])
    (out,) = engine.step()
    assert out.request_id == "mine" and out.finished and len(out.token_ids) == 2
    assert engine.add_request([1, 5, 6], params, "mine") == "mine"  # free again once delivered


@pytest.mark.parametrize("seed", range(10))
def test_random_faults_anywhere_leave_outputs_as_plain(models, monkeypatch, seed):
    """Faults drawn at random in every place a step can fail (prefill, recompute, drafting from history, the verify
    forward, the whole round), under random strategies, batch sizes, page sizes, pools and prefix sharing: the
    streamed and final outputs equal an undisturbed run's."""
    policy, drafter = models
    rng = random.Random(9000 + seed)
    strategy = rng.choice(["disable", "3_1_4", "5_1_6", "8_4_32", "suffix_8", "3_1_4+suffix_8", "12_1_13@0.3"])
    inputs = _inputs(rng, rng.randint(1, 8))
    config = EngineConfig(
        max_batch_size=rng.randint(1, 4),
        page_size=rng.choice([1, 4, 16]),
        max_model_len=48,
        prefix_sharing=rng.random() < 0.5,
    )
    reference = Engine(policy, config, drafter, FixedSelector(strategy)).generate(inputs)
    if rng.random() < 0.5:
        config = dataclasses.replace(config, kv_cache_tokens=64)
    for owner, name in [*FAULTS.values(), (ModelRunner, "decode")]:
        original, chance = getattr(owner, name), rng.choice([0.0, 0.1, 0.3])

        def faulty(*args, _original=original, _chance=chance, _name=name, **kwargs):
            if rng.random() < _chance:
                raise RuntimeError(f"injected fault in {_name}")
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, faulty)
    engine = Engine(policy, config, drafter, FixedSelector(strategy))
    streamed, final, _ = _run_through_faults(engine, inputs, "injected fault")
    # a fault delays its requests, so later batches are composed otherwise: float32 log-probs move by ulps, as
    # they do between batch compositions (tests/engine/test_engine.py); the tokens do not
    _assert_as_reference(streamed, final, reference, logprob_tolerance=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_a_group_whose_prefill_failed_leaves_no_page_copy_behind(models, monkeypatch, seed):
    """A GRPO group's siblings get a copy of its prompt's partial last page after the prefill forward. When that
    forward raises, the admission is undone and its pages freed; the group aborted and other requests sent, those
    pages go to them, and a copy left queued would overwrite one of them at their prefill."""
    policy, drafter = models
    rng = random.Random(9100 + seed)
    strategy = rng.choice(["disable", "3_1_4", "12_1_13@0.3", "3_1_4+suffix_8"])
    config = EngineConfig(max_batch_size=rng.randint(2, 4), page_size=4, max_model_len=64, prefix_sharing=True)
    engine = Engine(policy, config, drafter, FixedSelector(strategy))
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    prompt = [1, *(rng.randrange(3, 40) for _ in range(4 * rng.randint(1, 3) + rng.randint(1, 3)))]  # a partial page
    group = [engine.add_request(prompt, params) for _ in range(config.max_batch_size)]
    original = runner_module.prefill_shared

    def failing(*args, **kwargs):
        raise RuntimeError("injected fault in the prefill forward")

    monkeypatch.setattr(runner_module, "prefill_shared", failing)
    with pytest.raises(RuntimeError, match="injected fault"):
        engine.step()
    monkeypatch.setattr(runner_module, "prefill_shared", original)
    for request_id in group:
        assert engine.abort(request_id)
    aborted = engine.step()
    assert sorted(o.request_id for o in aborted) == sorted(group) and all(o.token_ids == [] for o in aborted)
    others = _inputs(rng, config.max_batch_size)
    streamed, final, raised = _run_through_faults(engine, others, "no fault expected")
    assert raised == 0
    _assert_as_reference(streamed, final, Engine(policy, config, drafter, FixedSelector(strategy)).generate(others))


SIGNAL_POINTS = [
    (runner_module, "unpack"),  # the round's end on the device, its tokens not yet with the requests
    (runner_module, "plain_round"),
    (round_module, "verify_trees"),
    (ModelRunner, "prefill"),
    (Engine, "_emit_rows"),
]


@pytest.mark.parametrize("seed", range(6))
def test_an_interrupt_inside_a_step_waits_for_its_end_and_loses_nothing(models, monkeypatch, seed):
    """Ctrl-C (a real SIGINT) arriving anywhere inside a step, also between the round's end on the device and its
    tokens reaching the requests (where it dropped a token, or left a drafter with nothing to read), is raised when
    the step ends; the next steps return everything, equal to an undisturbed run."""
    policy, drafter = models
    rng = random.Random(9200 + seed)
    strategy = rng.choice(["disable", "3_1_4", "8_4_32", "12_1_13@0.3", "3_1_4+suffix_8"])
    inputs = _inputs(rng, rng.randint(1, 6))
    config = EngineConfig(max_batch_size=rng.randint(1, 3), max_model_len=64)
    reference = Engine(policy, config, drafter, FixedSelector(strategy)).generate(inputs)
    sent, this_step = [0], [False]  # one interrupt a step (a second one stops at once, by design)
    for owner, name in SIGNAL_POINTS:
        original = getattr(owner, name)

        def interrupted(*args, _original=original, **kwargs):
            result = _original(*args, **kwargs)
            if not this_step[0] and rng.random() < 0.3:
                sent[0], this_step[0] = sent[0] + 1, True
                os.kill(os.getpid(), signal.SIGINT)  # delivered at once, inside the step
            return result

        monkeypatch.setattr(owner, name, interrupted)
    engine = Engine(policy, config, drafter, FixedSelector(strategy))
    ids = [engine.add_request(i.prompt_ids, i.params) for i in inputs]
    streamed: dict[str, list[int]] = {i: [] for i in ids}
    final, interrupts = {}, 0
    while engine.has_unfinished():
        this_step[0] = False
        try:
            outputs = engine.step()
        except KeyboardInterrupt as interrupt:
            assert "held to the end of the engine's step" in str(interrupt)
            interrupts += 1
            continue
        for out in outputs:
            streamed[out.request_id] += out.new_token_ids
            if out.finished:
                final[out.request_id] = out
    assert interrupts == sent[0] > 0
    _assert_as_reference({i: streamed[i] for i in ids}, {i: final[i] for i in ids}, reference)


def test_an_interrupted_generate_leaves_nothing_running(models):
    """A generate call stopped by Ctrl-C aborts its unfinished requests and takes their outputs with it: the engine
    is idle, the same call can be made again (and gives an undisturbed run's outputs), and a later call runs only
    its own requests."""
    policy, drafter = models

    class InterruptAtRound(FixedSelector):
        rounds = 0

        def choose(self, batch_size: int):
            InterruptAtRound.rounds += 1
            if InterruptAtRound.rounds == 3:
                raise KeyboardInterrupt("Ctrl-C")
            return super().choose(batch_size)

    config = EngineConfig(max_batch_size=4, max_model_len=200)
    long = [
        GenerateInput([5, 6, 7], SamplingParams(max_new_tokens=150, ignore_eos=True, seed=i), f"long{i}")
        for i in range(4)
    ]
    engine = Engine(policy, config, drafter, InterruptAtRound("3_1_4"))
    with pytest.raises(KeyboardInterrupt):
        engine.generate(long)
    assert not engine.has_unfinished() and not engine.scheduler.running
    again = engine.generate(long)
    assert [o.token_ids for o in again] == [o.token_ids for o in Engine(policy, config, drafter).generate(long)]
    rounds = len(engine.round_stats)
    (short,) = engine.generate([GenerateInput([5, 6], SamplingParams(max_new_tokens=2, seed=9), "short")])
    assert short.request_id == "short" and len(engine.round_stats) - rounds <= 1


def test_an_interrupt_while_a_step_builds_its_outputs_parks_them_and_frees_nothing_early(models, monkeypatch):
    """Ctrl-C after the held block, while the step built its outputs: the finished requests were released but their
    outputs never parked, their ids stayed taken for good, and every later generate was refused."""
    policy, drafter = models
    engine = Engine(policy, EngineConfig(max_batch_size=4, max_model_len=64), drafter, FixedSelector("3_1_4"))
    original, sent = Engine._outputs, []

    def outputs(self, finished, progressed):
        if finished and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, finished, progressed)

    monkeypatch.setattr(Engine, "_outputs", outputs)
    engine.add_request([1, 5, 6], SamplingParams(max_new_tokens=3, temperature=0.0), "a")
    with pytest.raises(KeyboardInterrupt):
        while True:
            engine.step()
    with pytest.raises(ValueError, match="'a' has finished in this engine, but its output comes with the next"):
        engine.add_request([1, 5, 6], SamplingParams(max_new_tokens=3, temperature=0.0), "a")
    (out,) = engine.take_undelivered()
    assert out.request_id == "a" and out.finished and len(out.token_ids) == 3
    (after,) = engine.generate([GenerateInput([1, 7], SamplingParams(max_new_tokens=2, temperature=0.0), "b")])
    assert after.request_id == "b" and not engine.has_unfinished()
