"""What a lost rollout worker cost: the typed record a RolloutBatch carries, and its one log line."""

from __future__ import annotations

import logging

from fastrl.rollout.rollout_run import WorkerHandle
from fastrl.rollout.types import WorkerReplacement


def loss_record(dead: WorkerHandle, rollout: int, cotrain: bool, replacement_id: str | None) -> WorkerReplacement:
    """The ``WorkerReplacement`` of ``dead`` (lost during or before rollout ``rollout``). With co-training on, its
    buffer is lost with it: the sequences it held at the last drafter round's end and those of the requests it had
    served since."""
    return WorkerReplacement(
        worker_id=dead.worker_id,
        rollout=rollout,
        reason=dead.lost_reason or "lost",
        rerun_request_ids=list(dead.rerun_request_ids),
        cotrain_sequences_lost=dead.buffered_sequences + dead.served_before_loss if cotrain else 0,
        replacement_id=replacement_id,
    )


def log_loss(log: logging.Logger, record: WorkerReplacement, records: list[WorkerReplacement]) -> None:
    """Append ``record`` to ``records`` and log it in one warning line: rollout, worker, why, what was re-run,
    co-training data lost, the replacement."""
    records.append(record)
    log.warning(
        "rollout %d: worker %s %s; %s; %d requests re-run (%s); %d co-training sequences lost",
        record.rollout,
        record.worker_id,
        record.reason,
        f"replaced by {record.replacement_id}" if record.replacement_id else "not replaced (restart_failed_workers)",
        len(record.rerun_request_ids),
        ", ".join(record.rerun_request_ids) or "none",
        record.cotrain_sequences_lost,
    )
