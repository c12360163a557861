"""A fault at a decode round's end (`SlotState.close_round` packing its results: an allocation on the device) or while
the drafter's feed takes the round in (`DrafterFeed.append` growing its width) comes after the device state advanced:
the round is undone, so the slots and the feed are as before it and the engine goes on as undisturbed. Outside the
undo, such a fault dropped a token from every row (a plain round) or left the drafter with nothing to read, every
later speculative round raising."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch

import fastrl.engine.batch as batch_module
import fastrl.engine.engine as engine_module
from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.drafter_feed import DrafterFeed
from fastrl.engine.engine import Engine
from fastrl.engine.runner import ModelRunner
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.strategy import DISABLE, Strategy
from tests.engine.test_graph_capture_safety import guarded_capture
from tests.engine.test_step_faults import _assert_as_reference, _inputs, _run_through_faults

FAULTS = {
    "round end": (batch_module, "pack"),  # inside close_round, after it advanced the rows
    "feed": (DrafterFeed, "append"),  # every caller: a round's end, a prefill's feed, a bounded backlog
}


class _Alternating(FixedSelector):
    """Three plain rounds, then three of the strategy, and so on: the plain ones leave the drafter entries to catch
    up on (and, with a small ``drafter_backlog``, make the runner bound them before a round)."""

    def __init__(self, strategy: str) -> None:
        super().__init__(strategy)
        self.rounds = 0

    @property
    def strategies(self) -> list[Strategy]:
        return [DISABLE, self._strategy]

    def choose(self, batch_size: int) -> Strategy:
        self.rounds += 1
        return self.strategies[(self.rounds // 3) % 2]


class _Chosen(FixedSelector):
    """Whichever of plain and the strategy the test set in ``now``."""

    def __init__(self, strategy: str) -> None:
        super().__init__(strategy)
        self.now = DISABLE

    @property
    def strategies(self) -> list[Strategy]:
        return [DISABLE, self._strategy]

    def choose(self, batch_size: int) -> Strategy:
        return self.now


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir()).eval()
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


def _make_faulty(monkeypatch, where: str, chance: float, rng: random.Random) -> list[int]:
    """Patch the fault point to raise with ``chance`` per call; returns the count of faults raised (one list)."""
    owner, name = FAULTS[where]
    original, raised = getattr(owner, name), [0]

    def faulty(*args, **kwargs):
        if rng.random() < chance:
            raised[0] += 1
            raise RuntimeError(f"injected fault in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, faulty)
    return raised


@pytest.mark.parametrize(
    "where, strategy, alternate",
    [
        ("round end", "disable", False),
        ("round end", "3_1_4", False),
        ("round end", "8_4_32", False),
        ("round end", "3_1_4+suffix_8", False),
        ("round end", "3_1_4", True),
        ("feed", "3_1_4", False),
        ("feed", "8_4_32", False),
        ("feed", "3_1_4+suffix_8", False),
        ("feed", "3_1_4", True),
        ("feed", "12_1_13@0.3", True),
    ],
)
def test_a_fault_at_a_rounds_end_or_in_the_feed_leaves_outputs_as_undisturbed(
    models, monkeypatch, where, strategy, alternate
):
    """Faults drawn at random at the fault point: the streamed and final outputs equal an undisturbed run's (an
    undone round runs again beside what the failed step admitted: float32 log-probs move by ulps)."""
    policy, drafter = models
    rng = random.Random(f"{where}/{strategy}/{alternate}")
    inputs = _inputs(rng, 5)
    config = EngineConfig(max_batch_size=3, max_model_len=128, drafter_backlog=1 if alternate else None)

    def selector() -> FixedSelector:
        return _Alternating(strategy) if alternate else FixedSelector(strategy)

    reference = Engine(policy, config, drafter, selector()).generate(inputs)
    raised = _make_faulty(monkeypatch, where, 0.25, rng)
    engine = Engine(policy, config, drafter, selector())
    streamed, final, faults = _run_through_faults(engine, inputs, "injected fault")
    assert faults == raised[0] > 0
    _assert_as_reference(streamed, final, reference, logprob_tolerance=1e-5)


def _snapshot(engine: Engine) -> dict:
    """The running requests' tokens, their slots' device state and their drafter's pending entries."""
    runner, running = engine.runner, engine.scheduler.running
    slots = [r.slot for r in running]
    feed = runner.feed
    pending = [feed._pending[s] for s in slots]
    return {
        "outputs": [list(r.output_ids) for r in running],
        "lengths": runner.state.lengths[slots].tolist(),
        "last": runner.state.last[slots].tolist(),
        "pending": pending,
        "behind": [feed._behind[s] for s in slots],
        "tokens": [feed.tokens[s, :n].tolist() for s, n in zip(slots, pending, strict=True)],
        "features": [feed.features[s, :n].clone() for s, n in zip(slots, pending, strict=True)],
    }


def _assert_same(before: dict, after: dict) -> None:
    for key in ("outputs", "lengths", "last", "pending", "behind", "tokens"):
        assert after[key] == before[key], key
    assert all(torch.equal(a, b) for a, b in zip(after["features"], before["features"], strict=True))


@pytest.mark.parametrize(
    "where, round_strategy, graphs",
    [
        ("round end", "disable", False),
        ("round end", "3_1_4", False),
        ("feed", "disable", False),
        ("feed", "3_1_4", False),
        ("feed", "disable", True),
        ("feed", "3_1_4", True),
    ],
)
def test_a_failed_round_leaves_the_slots_and_the_feed_as_before(models, monkeypatch, where, round_strategy, graphs):
    """The round's end advanced the rows (and a speculative round took the drafter's entries): after the fault, the
    rows, the requests and every pending entry (tokens, features, whether plain rounds left them) are as before the
    round, eager or graphed; the next step then runs the round."""
    policy, drafter = models
    config = EngineConfig(max_batch_size=3, max_model_len=96, attention_kernel=False)
    with monkeypatch.context() as patch:
        if graphs:
            patch.setattr(engine_module, "ModelRunner", partial(ModelRunner, graph_capture=guarded_capture))
        engine = Engine(policy, config, drafter, _Chosen("3_1_4"))
    assert (engine.runner.graphs is not None) == graphs
    for i in range(3):
        params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=i, ignore_eos=True)
        engine.add_request([1, 5 + i, 9, 12], params)
    for now in (DISABLE, engine.selector._strategy, DISABLE):  # the feed holds entries a plain round left
        engine.selector.now = now
        engine.step()
    engine.selector.now = Strategy.parse(round_strategy)
    before = _snapshot(engine)
    with monkeypatch.context() as patch:
        owner, name = FAULTS[where]
        original = getattr(owner, name)

        def failing(*args, **kwargs):
            raise RuntimeError(f"injected fault in {name}")

        patch.setattr(owner, name, failing)
        with pytest.raises(RuntimeError, match="injected fault"):
            engine.step()
    assert getattr(owner, name) is original
    _assert_same(before, _snapshot(engine))
    outputs = engine.step()
    assert len(outputs) == 3 and all(out.new_token_ids for out in outputs)


def _feed_with_entries() -> tuple[DrafterFeed, list[int], torch.Tensor]:
    """A feed whose slots 0 and 2 hold 3 and 1 entries (token ids 10.., features their ids), and those slots."""
    feed = DrafterFeed(3, 2, torch.float32, torch.device("cpu"), 4, 16)
    tokens = torch.tensor([[10, 11, 12], [20, 21, 22]])
    feed.append([0, 2], tokens, tokens.unsqueeze(2).expand(2, 3, 2).float(), [3, 1])
    return feed, [0, 2], torch.tensor([0, 2])


def test_a_failed_append_writes_nothing_so_the_take_can_be_undone():
    """An append that raises (here: a count missing) after a take had written the round's entries over the taken
    ones, and counted the first rows: the take restored, the drafter read other tokens than it had pending."""
    feed, slot_ids, slots = _feed_with_entries()
    taken = feed.take(slots, slot_ids)
    new = torch.tensor([[90, 91], [95, 96]])
    with pytest.raises(ValueError):
        feed.append(slot_ids, new, torch.zeros(2, 2, 2), [2])
    feed.restore_take()
    again = feed.take(slots, slot_ids)
    assert again.counts.tolist() == taken.counts.tolist() == [3, 1]
    assert torch.equal(again.tokens, taken.tokens) and torch.equal(again.features, taken.features)


def test_a_completed_append_makes_the_take_final():
    """Once the round's entries are written over the taken ones, undoing the take would count them as the old."""
    feed, slot_ids, slots = _feed_with_entries()
    feed.take(slots, slot_ids)
    feed.append(slot_ids, torch.tensor([[90], [95]]), torch.zeros(2, 1, 2), [1, 1])
    feed.restore_take()
    assert [feed._pending[s] for s in slot_ids] == [1, 1]
