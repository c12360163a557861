"""A bandit state file holds finite numbers a bandit can load: a NaN, a covariance that is no covariance or an entry of
the wrong shape is one ValueError naming the file and the entry, the file left as it was; and a state holding a NaN
is never written (a bandit warm-started from a NaN load predicted NaN for every arm, ran its first arm for ever and
saved the NaN back)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.cost_model import CostModel
from fastrl.assets_path import bundled_model_dir
from fastrl.commands.bandit_state_file import (
    drafter_fingerprint,
    learned_setting,
    read_state_file,
    tensors_fingerprint,
    write_state_file,
)
from fastrl.commands.output_guard import OutputTarget
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter_checkpoint import load_drafter, read_drafter_weights, save_drafter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy
from tests.helpers import last_layer_drafter

STOP, CHAIN = Strategy.parse("12_1_13@0.3"), Strategy.parse("3_1_4")


def _learned_state() -> dict:
    """A calibrated bandit after rounds of every kind: its filter's covariance correlates the load with the biases."""
    arms = [DISABLE, CHAIN, STOP]
    calibration = CostModel.fit([(a, b, 0.01 * (1 + i) + 0.001 * b) for i, a in enumerate(arms) for b in (1, 8)])
    selector = BanditSelector(BanditConfig(strategies=[str(a) for a in arms]), calibration)
    for batch in (1, 4, 8):
        selector.observe(RoundStats(CHAIN, batch, [3] * batch, [2] * batch, [3] * batch, 0.02))
        selector.observe(RoundStats(STOP, batch, [5] * batch, [3] * batch, [4] * batch, 0.03))
        selector.observe(RoundStats(DISABLE, batch, [0] * batch, [0] * batch, [1] * batch, 0.01))
    return json.loads(json.dumps(selector.state_dict()))


def _not_psd(state: dict) -> None:
    cov = state["times"]["filter"]["cov"]
    cov[1][2] = cov[2][1] = 10 * math.sqrt(cov[1][1] * cov[2][2])  # a correlation of 10


def _asymmetric(state: dict) -> None:
    state["times"]["filter"]["cov"][0][1] += 0.5


DAMAGES = {
    "times.filter.mean[0] is nan": lambda s: s["times"]["filter"]["mean"].__setitem__(0, math.nan),
    "times.filter.mean[2] is 1e+300": lambda s: s["times"]["filter"]["mean"].__setitem__(2, 1e300),
    "times.filter.cov[1][1] is nan": lambda s: s["times"]["filter"]["cov"][1].__setitem__(1, math.nan),
    "times.filter.cov[0][0] is -1.0: a variance must be > 0": lambda s: s["times"]["filter"]["cov"][0].__setitem__(
        0, -1.0
    ),
    "times.filter.cov is not positive semi-definite": _not_psd,
    "times.filter.cov is not symmetric": _asymmetric,
    "explore_credit is nan": lambda s: s.__setitem__("explore_credit", math.nan),
    "pulls['3_1_4'] is 'x'": lambda s: s["pulls"].__setitem__("3_1_4", "x"),
    "chain_rounds['12_1_13@0.3']['0'] must be": lambda s: s["chain_rounds"][str(STOP)]["0"].__setitem__(0, math.nan),
    "acceptance['3_1_4'] must be [hits, trials], 3 counts each": lambda s: s["acceptance"]["3_1_4"][0].pop(),
    "last_batch[1] is 0": lambda s: s["last_batch"].__setitem__(1, 0),
    "setting.dtype must be a string, got ['bfloat16']": lambda s: s.__setitem__("setting", {"dtype": ["bfloat16"]}),
    "setting.drafter must be a fingerprint string or null, got 7": lambda s: s.__setitem__("setting", {"drafter": 7}),
    "setting must be an object, got 'x'": lambda s: s.__setitem__("setting", "x"),
}


@pytest.mark.parametrize("message", list(DAMAGES))
def test_a_damaged_entry_is_one_error_naming_the_file_and_the_entry(tmp_path, message):
    state = _learned_state()
    DAMAGES[message](state)
    path = tmp_path / "bandit.json"
    content = json.dumps(state)
    path.write_text(content)
    with pytest.raises(ValueError) as raised:
        read_state_file("bandit_state", path)
    assert str(raised.value).startswith(f"bandit_state={path}: a damaged bandit state")
    assert message in str(raised.value)
    assert path.read_text() == content


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_path_that_is_no_regular_file_is_named_not_read_as_no_state(tmp_path, kind):
    """A FIFO was read as an empty file ("no state yet", its size 0) and replaced by a regular file at the end."""
    path = tmp_path / "bandit.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(ValueError) as raised:
        read_state_file("bandit_state", path)
    said = "a directory" if kind == "directory" else "not a regular file"
    assert str(raised.value) == f"bandit_state={path} is {said}: name a bandit state JSON file (or a new path)"


def test_a_learned_state_reads_back_and_predicts_finite_goodputs(tmp_path):
    path = tmp_path / "bandit.json"
    path.write_text(json.dumps(_learned_state()))
    state = read_state_file("bandit_state", path)
    selector = BanditSelector(BanditConfig.from_dict(state["config"]))
    selector.warm_start(state)
    assert all(math.isfinite(selector.predict(arm, b)) for arm in selector.strategies for b in (1, 3, 21))


class _NanState:
    def state_dict(self) -> dict:
        return _learned_state() | {"explore_credit": math.nan}


def test_a_state_holding_a_nan_is_not_written(tmp_path):
    path = tmp_path / "bandit.json"
    path.write_text("earlier\n")
    target = OutputTarget("bandit_state", Path(path), path, True)
    with pytest.raises(ValueError, match=f"bandit_state={path}: not written, the bandit's state holds a NaN"):
        write_state_file(target, _NanState(), {})  # type: ignore[arg-type]
    assert path.read_text() == "earlier\n"


def test_a_drafters_fingerprint_holds_its_draft_vocabulary_and_is_unchanged_without_one(tmp_path):
    """The same weights over a reduced draft vocabulary draft other tokens with another acceptance: a state learned
    with the full-vocabulary drafter was taken for them. The vocabulary (every id, in order) is now part of the
    fingerprint, from the files as from the loaded drafter; without one the fingerprint is the weights' alone, as
    every state saved before holds it."""
    policy = load_model(bundled_model_dir())
    drafter = last_layer_drafter(policy)
    save_drafter(drafter, tmp_path / "full", "arith-tiny")
    ids = torch.randperm(policy.config.vocab_size, generator=torch.Generator().manual_seed(3))[:30]
    for name, vocab in (("narrow", ids), ("reordered", ids.flip(0)), ("other", ids[:29])):
        drafter.set_draft_vocab(vocab)
        save_drafter(drafter, tmp_path / name, "arith-tiny")
    prints = {
        name: drafter_fingerprint(tmp_path / name, "float32") for name in ("full", "narrow", "reordered", "other")
    }
    assert len(set(prints.values())) == 4, prints
    weights_alone = tensors_fingerprint(read_drafter_weights(tmp_path / "full").items(), torch.float32)
    assert prints["full"] == weights_alone == drafter_fingerprint(tmp_path / "full", "bfloat16")
    for name in ("full", "narrow"):  # what a run records (the loaded drafter) is what the files tell before it
        loaded = load_drafter(tmp_path / name, policy)[0]
        engine = SimpleNamespace(drafter=loaded, model=policy, config=SimpleNamespace(dtype="float32"))
        assert learned_setting(engine)["drafter"] == prints[name]  # type: ignore[arg-type]
