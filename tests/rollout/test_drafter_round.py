"""DrafterRounds: a rollout hands over the co-training slices still in a training step, and the round collects them
(their seconds and failures count) before the workers' finish reports; a worker lost meanwhile is skipped."""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.cotrain.cotrainer import SliceMetrics
from fastrl.rollout.drafter_round import DrafterRounds
from fastrl.rollout.worker_cotrain import RoundReport


@dataclass(eq=False)
class Worker:
    worker_id: str
    alive: bool = True


def make_rounds(answers: dict[str, object], log: list[str]) -> DrafterRounds:
    """Calls are (worker, key) pairs; ``answers[key]`` is what the call returned (absent: the worker died)."""

    def gather(calls: list) -> list:  # as the Ray manager's: a call without an answer marks its worker lost
        log.append(",".join(key for _, key in calls))
        for worker, key in calls:
            worker.alive = worker.alive and key in answers
        return [(worker, answers[key]) for worker, key in calls if worker.alive]

    def call_all(method: str) -> list:
        log.append(method)
        return []

    return DrafterRounds(call_all, gather, lambda: 0, lambda version, state: None)


def test_running_slices_count_in_the_round_and_come_before_the_finish_reports() -> None:
    w0, w1 = Worker("w0"), Worker("w1")
    answers = {
        "slice-1": SliceMetrics(steps=1, tokens=40, seconds=2.5, stopped=True),
        "finish-0": RoundReport(steps=1, tokens=40, loss_sum=4.0, top1_sum=20.0, seconds=1.0),
        "finish-1": RoundReport(steps=1, tokens=40, loss_sum=2.0, top1_sum=30.0),
    }
    log: list[str] = []
    rounds = make_rounds(answers, log)
    ended = [("w1", SliceMetrics(steps=0, seconds=0.25, stopped=True))]
    rounds.start([(w0, "finish-0"), (w1, "finish-1")], ended, [(w1, "slice-1")])
    stats = rounds.close()
    assert log[:2] == ["slice-1", "finish-0,finish-1"]  # the running slice is collected first
    assert stats.steps == 2 and stats.tokens == 80  # steps from the finish reports, whoever took them
    assert stats.seconds == 0.25 + 2.5 + 1.0
    assert stats.loss == 6.0 / 80 and stats.top1 == 50.0 / 80
    assert rounds.close() is stats  # closed once; later calls return the last stats


def test_a_running_slice_that_failed_is_a_failure_and_a_lost_worker_is_skipped() -> None:
    w0, w1 = Worker("w0"), Worker("w1", alive=False)
    answers = {
        "slice-0": SliceMetrics(seconds=0.5, error="FloatingPointError: loss is nan"),
        "slice-1": SliceMetrics(steps=1, seconds=3.0),
        "finish-0": RoundReport(),
    }
    rounds = make_rounds(answers, [])
    rounds.start([(w0, "finish-0"), (w1, "finish-1")], [], [(w0, "slice-0"), (w1, "slice-1")])
    stats = rounds.close()
    assert stats.failures == ["w0: FloatingPointError: loss is nan"]
    assert stats.seconds == 0.5  # the lost worker's slice never answered


def test_every_running_slice_is_collected_in_one_gather_and_a_hung_one_is_skipped() -> None:
    """Two workers in a training step at the end of the rollout: one gather (one deadline) collects both; the one
    that never answers is marked lost there and its slice is not counted, while the other's is, under its own id."""
    w0, w1, w2 = Worker("w0"), Worker("w1"), Worker("w2")
    answers = {
        "slice-0": SliceMetrics(steps=1, seconds=2.0),
        "slice-2": SliceMetrics(steps=1, seconds=3.0, error="RuntimeError: boom"),
        "finish-0": RoundReport(),
        "finish-2": RoundReport(),
    }
    log: list[str] = []
    rounds = make_rounds(answers, log)
    rounds.start(
        [(w0, "finish-0"), (w1, "finish-1"), (w2, "finish-2")], [], [(w0, "slice-0"), (w1, "slice-1"), (w2, "slice-2")]
    )
    stats = rounds.close()
    assert log[0] == "slice-0,slice-1,slice-2"
    assert not w1.alive and w0.alive and w2.alive
    assert stats.seconds == 2.0 + 3.0
    assert stats.failures == ["w2: RuntimeError: boom"]


def test_an_answer_from_a_worker_killed_as_its_call_ended_counts_for_that_worker() -> None:
    """The liveness monitor can kill a worker as hung in the moment its slice ends: the slice's answer is there, the
    worker is no longer alive. The answers were paired with the workers still alive, one fewer than the answers
    (a ValueError out of the rollout), or with the wrong workers."""
    w0, w1, w2 = Worker("w0"), Worker("w1"), Worker("w2")
    answers = {
        "slice-0": SliceMetrics(steps=1, seconds=2.0),
        "slice-1": SliceMetrics(steps=1, seconds=3.0, error="RuntimeError: late"),
        "slice-2": SliceMetrics(steps=1, seconds=5.0, error="RuntimeError: boom"),
        "finish-0": RoundReport(buffer_sequences=7),
        "finish-2": RoundReport(buffer_sequences=9),
    }
    rounds = make_rounds(answers, [])
    gather = rounds.gather

    def killed_as_it_answered(calls: list) -> list:
        got = gather(calls)
        w1.alive = False
        return got

    rounds.gather = killed_as_it_answered
    rounds.start([(w0, "finish-0"), (w2, "finish-2")], [], [(w0, "slice-0"), (w1, "slice-1"), (w2, "slice-2")])
    stats = rounds.close()
    assert stats.failures == ["w1: RuntimeError: late", "w2: RuntimeError: boom"]
    assert stats.seconds == 2.0 + 3.0 + 5.0
    assert (w0.buffered_sequences, w2.buffered_sequences) == (7, 9)


def test_a_refused_push_is_a_failure_of_the_round_not_of_the_rollout() -> None:
    """The merged drafter's push is all or nothing (a worker refusing it leaves every worker at the last version);
    its refusal raised out of the rollout and lost its results, where every other co-training failure is a line of
    the round's report."""
    import torch

    from fastrl.cotrain.cotrainer import TrainedDrafter
    from fastrl.rollout.drafter_round import close_drafter_round

    trained = TrainedDrafter({"w": torch.ones(2)}, steps=3, tokens=30, base_version=4)
    answers = {"finish_drafter_round": [RoundReport(steps=3, tokens=30)], "trained_drafter": [trained]}
    calls: list[str] = []

    def call_all(method: str) -> list:
        calls.append(method)
        return answers[method]

    def push(version: int, state: dict) -> None:
        raise ValueError(f"drafter version {version} refused by rollout worker w0: non-finite; every worker keeps 4")

    stats = close_drafter_round(call_all, 4, push, [])
    assert stats.failures == ["push: drafter version 5 refused by rollout worker w0: non-finite; every worker keeps 4"]
    assert stats.steps == 3 and "heldout_top1" not in calls  # the round's totals kept; nothing measured after it


def test_a_diverged_copy_is_left_out_of_the_merge_and_the_others_are_pushed() -> None:
    """One worker's non-finite copy used to fail the whole merge: no new drafter from the healthy workers either."""
    import torch

    from fastrl.cotrain.cotrainer import TrainedDrafter
    from fastrl.rollout.drafter_round import close_drafter_round

    def copy(value: float, steps: int) -> TrainedDrafter:
        return TrainedDrafter({"w": torch.full((3,), value)}, steps=steps, tokens=10, base_version=4)

    trained = [copy(1.0, 1), copy(float("nan"), 2), None, copy(4.0, 3)]
    answers = {"finish_drafter_round": [RoundReport(steps=1, tokens=10)] * 4, "trained_drafter": trained}
    pushed: list[tuple[int, dict]] = []
    stats = close_drafter_round(answers.__getitem__, 4, lambda v, s: pushed.append((v, s)), [])
    assert stats.failures == ["merge: worker slot 1's copy holds non-finite values in w: left out"]
    assert [v for v, _ in pushed] == [5]
    assert torch.allclose(pushed[0][1]["w"], torch.full((3,), (1.0 * 1 + 4.0 * 3) / 4))


def test_a_worker_that_cannot_hand_its_copy_over_is_a_failure_of_the_round() -> None:
    """`trained_drafter` raising on one worker (an allocation that fails while copying the weights) raised the
    Ray task error out of the rollout, lost its finished results, and did so again every rollout after."""
    from ray.exceptions import RayTaskError

    from fastrl.rollout.drafter_round import close_drafter_round

    cause = RuntimeError("could not copy the trained drafter")
    error = RayTaskError("trained_drafter", "Traceback (most recent call last): ...", cause)
    answers = {"finish_drafter_round": [RoundReport(steps=3, tokens=30)]}

    def call_all(method: str) -> list:
        if method == "trained_drafter":
            raise error
        return answers[method]

    pushed: list[int] = []
    stats = close_drafter_round(call_all, 4, lambda version, state: pushed.append(version), [])
    assert stats.failures == ["trained_drafter: RuntimeError: could not copy the trained drafter"]
    assert stats.steps == 3 and pushed == []
