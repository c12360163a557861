"""The end of a rollout's co-training, for any set of workers: finish the updates due, merge, push, measure."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from fastrl.cotrain.cotrainer import SliceMetrics, TrainedDrafter, merge_weights, mergeable
from fastrl.rollout.cotrain_stats import combine_rounds, heldout_mean
from fastrl.rollout.errors import short_error
from fastrl.rollout.types import DrafterTrainingStats
from fastrl.rollout.worker_cotrain import RoundReport

FINISH = "finish_drafter_round"

DrafterState = tuple[int, dict[str, Tensor]]  # a backend's drafter_state(): version and weights


class DrafterAtBoundary:
    """The drafter as the last step boundary (the last policy push) left it, for checkpoints: a checkpoint taken
    after a rollout's drafter round merged a new version, before the step's update (Ctrl-C), must hold the drafter
    the resumed run's repeat of that rollout starts from, as the history index, the selectors and the co-training
    state it sits beside do. Kept only from the first drafter change after a push until the next push (one copy of
    the drafter at most, and none while nothing changed it). Before the first push there is no boundary yet: the
    live drafter is the one to save, as the history index's and the selectors' states are then the live ones."""

    def __init__(self) -> None:
        self._saved: DrafterState | None = None
        self._pushed = False

    def before_change(self, read_live: Callable[[], DrafterState]) -> None:
        """A drafter round is about to install a new version: keep the current one unless one is kept already."""
        if self._pushed and self._saved is None:
            self._saved = read_live()

    def mark(self) -> None:
        """A policy push: the live drafter is the boundary's."""
        self._saved, self._pushed = None, True

    def state(self, read_live: Callable[[], DrafterState]) -> DrafterState:
        """The boundary's drafter: the one kept, else the live one."""
        return self._saved if self._saved is not None else read_live()


class DrafterRounds:
    """A backend's co-training rounds: at most one still finishing on the workers (``start`` fired their
    ``finish_drafter_round`` calls), and the stats and drafter version of the last one closed.

    ``call_all(method)`` calls a method on every live worker and collects the answers in slot order; ``gather(calls)``
    collects the answers of (worker, ref) calls as (worker, answer) pairs, in call order, skipping a worker that died
    or did not answer within its deadline (and marking it not ``alive``); ``version()`` is the current drafter
    version; ``push(version, state)`` installs a drafter everywhere.
    """

    def __init__(
        self,
        call_all: Callable[[str], list],
        gather: Callable[[list], list[tuple]],
        version: Callable[[], int],
        push: Callable[[int, dict[str, Tensor]], None],
    ) -> None:
        self.call_all, self.gather, self.version, self.push = call_all, gather, version, push
        self._pending: tuple[list, list[tuple[str, SliceMetrics]], list] | None = None
        self.last: tuple[DrafterTrainingStats, int] = (DrafterTrainingStats(), version())
        self.late_slices: list[tuple[str, SliceMetrics]] = []  # the last closed round's slices that outran it

    def start(self, calls: list, slices: list[tuple[str, SliceMetrics]], running: list | None = None) -> None:
        """Remember a rollout whose workers run ``finish_drafter_round`` (``calls``: (worker, ref) pairs), the
        co-training slices that ended within it, and those still running (``running``: (worker, ref) pairs, each
        worker with a ``worker_id`` and an ``alive`` flag; a worker finishes its slice before its
        ``finish_drafter_round``)."""
        self._pending = (calls, slices, list(running or []))

    def close(self) -> DrafterTrainingStats:
        """Finish the pending round, if any (collect the slices still running, kept in ``late_slices``, merge, push,
        measure); the last round's stats."""
        if self._pending is not None:
            (calls, slices, running), self._pending = self._pending, None
            # One gather for every running slice (one deadline, however many hang); it marks those that did not
            # answer as lost, and the answers of the others come in order.
            self.late_slices = [(w.worker_id, m) for w, m in self.gather(running)]
            slices = slices + self.late_slices
            answered = self.gather(calls)
            for worker, report in answered:
                worker.buffered_sequences = report.buffer_sequences  # what losing it before the next round costs
            reports = [report for _, report in answered]

            def call(method: str) -> list:  # the finish calls were made by start(); the rest go out now
                return reports if method == FINISH else self.call_all(method)

            stats = close_drafter_round(call, self.version(), self.push, slices)
            self.last = (stats, self.version())
        return self.last[0]


def close_drafter_round(
    call_all: Callable[[str], list],
    version: int,
    push: Callable[[int, dict[str, Tensor]], None],
    slices: list[tuple[str, SliceMetrics]],
) -> DrafterTrainingStats:
    """Every worker finishes the rollout's updates (``steps`` schedule) and reports them (``call_all(method)``
    calls a worker method on every live worker and returns the answers in slot order); the copies trained on top
    of drafter ``version`` are averaged (weighted by steps, in slot order) into ``version + 1`` and ``push``ed;
    the held-out top-1 is measured before and after the push. A push the workers refuse (ValueError: the backends'
    pushes are all or nothing) is a failure of the round, not of the rollout: the version stays."""
    reports: list[RoundReport] = call_all(FINISH)
    stats = combine_rounds(reports, slices)
    try:
        trained: list[TrainedDrafter | None] = call_all("trained_drafter")
    except Exception as err:  # a worker that could not hand its copy over (it drops the copy): no merge this round
        stats.failures.append(f"trained_drafter: {short_error(err)}")
        return stats
    kept, failures = mergeable({f"worker slot {i}": t for i, t in enumerate(trained) if t is not None}, version)
    stats.failures += failures
    if not kept:
        return stats
    try:
        merged = merge_weights(kept)
    except ValueError as err:
        stats.failures.append(f"merge: {err}")
        return stats
    try:
        push(version + 1, merged)
    except ValueError as err:
        stats.failures.append(f"push: {err}")
        return stats
    if stats.heldout_tokens:
        stats.heldout_top1 = heldout_mean(call_all("heldout_top1"))
    return stats
