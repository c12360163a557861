"""rollout=local resuming a Ray run's checkpoint: every worker slot's history groups are restored into the one
worker's index, none dropped."""

from __future__ import annotations

from fastrl.assets_path import bundled_model_dir
from fastrl.rollout.local import LocalRollout
from fastrl.rollout.worker_config import RolloutWorkerConfig
from fastrl.speculative.history import HistoryIndex, HistoryState


def _one_group(prompt: list[int], response: list[int]) -> HistoryState:
    index = HistoryIndex()
    index.start("s", None, prompt)
    index.extend("s", response)
    index.finish("s", keep=True)
    return index.state()


def test_load_history_state_folds_every_slot_into_the_one_index() -> None:
    slot0, slot1 = _one_group([5, 6, 7], [8, 9, 10, 11]), _one_group([20, 21], [22, 23, 24])
    local = LocalRollout(RolloutWorkerConfig(model_dir=str(bundled_model_dir()), strategy="suffix_8"))
    local.load_history_state([slot0, None, slot1])  # None: a slot without a history index
    (after,) = local.history_state()
    assert after is not None
    assert sorted(after.groups) == sorted(slot0.groups + slot1.groups)
    assert after.num_tokens == slot0.num_tokens + slot1.num_tokens
    local.load_history_state([slot1])
    assert local.history_state() == [slot1]
