"""A rollout's worker replacements reach the step metrics (and so metrics.jsonl and W&B) as counts."""

from fastrl.rl.metrics import worker_loss_fields
from fastrl.rollout.types import WorkerReplacement


def test_worker_loss_fields_count_replacements_reruns_and_lost_sequences():
    lost = [
        WorkerReplacement("w0", rollout=3, reason="died", rerun_request_ids=["a", "b"], cotrain_sequences_lost=5),
        WorkerReplacement("w1", rollout=3, reason="hung", rerun_request_ids=["c"], replacement_id="w2"),
    ]
    # w0 was lost with restarts off (no replacement): counted lost, not replaced (it was counted replaced)
    fields = worker_loss_fields(lost)
    assert fields == {"workers_lost": 2, "workers_replaced": 1, "requests_rerun": 3, "cotrain_sequences_lost": 5}
    assert set(worker_loss_fields([]).values()) == {0}
