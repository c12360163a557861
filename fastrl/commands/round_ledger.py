"""Which decode rounds made which results: an interrupted `fastrl generate` reports only the work behind the results
it wrote (the rows of requests still running when it stopped are decoded again by the resumed run)."""

from __future__ import annotations

import dataclasses
import math

from fastrl.engine.engine import Engine
from fastrl.engine.request import RequestOutput
from fastrl.interrupts import held_interrupts
from fastrl.strategy.round_stats import RoundStats


class RoundLedger:
    """The decode rounds an engine runs from now on, each with the requests its rows ran and the tokens each emitted
    there, so that an interrupted run reports only the work behind the results it wrote (``kept``).

    Read off the step outputs: every row of a step's decode round progresses, so its request has an output in that
    step; a request's first output comes from its prefill (or its refusal), never from a decode round.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.start = len(engine.round_stats)
        # by round (its place in engine.round_stats): request id -> tokens its row emitted; None: rows not told apart
        self.rows: dict[int, dict[str, int] | None] = {}
        self._seen: set[str] = set()
        self.interrupt: KeyboardInterrupt | None = None  # came in the last step, after its outputs (``step``)

    def step(self) -> list[RequestOutput]:
        """One engine step, its decode round's rows logged (a step that raises logs none: its outputs never came).
        An interrupt is held to the end of the step and of taking its outputs (one that came as the step returned
        would lose them), which are returned, the interrupt kept in ``interrupt`` for the caller to raise once it
        has kept them; where the step's outputs were lost all the same, its round is not logged (``_log_rounds``)."""
        before, self.interrupt = len(self.engine.round_stats), None
        outputs: list[RequestOutput] | None = None
        try:
            with held_interrupts("a step and taking its outputs", raising_only=True):
                outputs = self.engine.step()
        except KeyboardInterrupt as interrupt:
            self.interrupt = interrupt
            if outputs is None:  # the step raised it: what it had progressed waits in the engine
                outputs = self.engine.take_undelivered()
        self._log_rounds(range(before, len(self.engine.round_stats)), outputs, self.interrupt is not None)
        self._seen.update(o.request_id for o in outputs)
        return outputs

    def _log_rounds(self, new: range, outputs: list[RequestOutput], interrupted: bool) -> None:
        """The rows of the rounds ``new`` one step ran, read off its ``outputs``: one decode round a step, whose
        rows add up to its outputs' new tokens; a round whose rows do not cannot be told apart (None, kept whole),
        unless the step was ``interrupted``: then its outputs were lost (none made a written result), so it is not
        logged, and ``kept`` drops it."""
        rows = {o.request_id: len(o.new_token_ids) for o in outputs if o.request_id in self._seen}
        for i in new:
            known = len(new) == 1 and sorted(rows.values()) == sorted(self.engine.round_stats[i].emitted_tokens)
            if known or not interrupted:
                self.rows[i] = rows if known else None

    def kept(self, written: set[str]) -> list[RoundStats]:
        """The rounds cut down to the rows of the requests in ``written`` (see ``without_rows``): a round left
        without rows, or whose step never delivered its outputs, is dropped (no written result came of it); a round
        whose rows could not be told apart is kept whole."""
        kept = []
        for i in range(self.start, len(self.engine.round_stats)):
            if i not in self.rows:  # its step raised, or lost its outputs to an interrupt: no written result
                continue
            stats, rows = self.engine.round_stats[i], self.rows[i]
            cut = stats if rows is None else without_rows(stats, [n for r, n in rows.items() if r not in written])
            if cut is not None:
                kept.append(cut)
        return kept


def without_rows(stats: RoundStats, emitted: list[int]) -> RoundStats | None:
    """``stats`` less one row for each entry of ``emitted`` (the tokens that row emitted); None when no row is left.

    A row is found by its values: one that emitted as many tokens, preferring accepted drafts = tokens - 1 (what
    every row whose request kept running emitted, so its values are exact; a request that finished in the round
    may have stopped inside its accepted path, and among rows of as many tokens its own is not known). The rows
    kept keep their share of the round's times (wall, draft, verify, catch-up: the same for every row of a batch)
    and of its plain-decoding estimate (per token: plain time at the round's batch size x tokens emitted, a plain
    round's own time), so goodput and the speedup estimate count the kept rows' tokens against the kept rows' time.
    """
    rows = list(zip(stats.drafted_tokens, stats.accepted_tokens, stats.emitted_tokens, strict=True))
    for n in emitted:
        rows.remove(max((r for r in rows if r[2] == n), key=lambda r: r[1] == n - 1))
    if not rows:
        return None
    if len(rows) == stats.batch_size:
        return stats
    share = len(rows) / stats.batch_size
    total = stats.total_emitted
    token_share = sum(r[2] for r in rows) / total if total else share
    wall = stats.wall_time_s * share
    return dataclasses.replace(
        stats,
        batch_size=len(rows),
        drafted_tokens=[r[0] for r in rows],
        accepted_tokens=[r[1] for r in rows],
        emitted_tokens=[r[2] for r in rows],
        wall_time_s=wall,
        draft_time_s=stats.draft_time_s * share,
        verify_time_s=stats.verify_time_s * share,
        plain_time_estimate_s=stats.plain_time_estimate_s * token_share,
        catch_up_time_s=min(stats.catch_up_time_s * share, math.nextafter(wall, 0.0)),
    )
