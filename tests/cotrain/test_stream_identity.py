"""A stream's shards are only ever read back by a run with the settings that generated them: the settings are
recorded in the stream directory before its first shard, a run of other settings is refused (naming each setting
with the stream's value and its own) before any rollout, and shards without a record are refused, never reused.
Nothing of the stream is deleted by a refusal."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from fastrl.cotrain.offline import OfflineDrafterConfig, train_offline
from fastrl.cotrain.rollout_plan import RolloutPlan
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.cotrain.test_stream_trainer import make_run
from tests.helpers import make_hf_model

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 3, 9, 9, 2]]
CFG = OfflineDrafterConfig(
    num_prompts=len(PROMPTS), eval_prompts=2, max_new_tokens=10, epochs=1, shard_requests=2, gen_batch_size=4,
    accept_requests=1, accept_batch_size=1, accept_strategies=["3_1_4"],
)  # fmt: skip


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama", seed=4).save_pretrained(path)
    return load_model(path)


def _train(policy, stream: Path, cfg: OfflineDrafterConfig = CFG) -> dict[str, torch.Tensor]:
    """One tiny train_offline run; the trained drafter's weights."""
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    train_offline(policy, drafter, PROMPTS, PROMPTS[:2], cfg, stream, "test")
    return drafter.state_dict()


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def generations(monkeypatch) -> list[int]:
    """The number of requests of every engine generation of a rollout plan (held-out or shard)."""
    calls: list[int] = []
    real = RolloutPlan.generate

    def generate(self, policy, requests, batch_size, device):
        calls.append(len(requests))
        return real(self, policy, requests, batch_size, device)

    monkeypatch.setattr(RolloutPlan, "generate", generate)
    return calls


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"seed": 7}, r"\(seed\): seed=0 \(now 7\)"),
        ({"rollout_dtype": "bfloat16"}, r"\(rollout_dtype\): rollout_dtype='float32' \(now 'bfloat16'\)"),
    ],
)
def test_shards_of_other_settings_are_refused_after_the_advised_restart(policy, tmp_path, change, shown, generations):
    """The advice for a damaged save (delete resume/ to train the stream from its first shard again) and a run killed
    before its first save both leave shards and no state: a run of other settings read them back as its own (and
    recorded its own settings); it is refused before any rollout, and the shards are kept."""
    _train(policy, tmp_path / "s")
    shutil.rmtree(tmp_path / "s" / "resume")
    kept, generations[:] = _files(tmp_path / "s"), []
    with pytest.raises(ValueError, match=f"s holds a run with other settings {shown}") as err:
        _train(policy, tmp_path / "s", dataclasses.replace(CFG, **change))
    assert "give another stream_dir" in str(err.value) and "delete the stream's shard_*.json" in str(err.value)
    assert generations == [] and _files(tmp_path / "s") == kept
    # the same settings read the shards back (only the held-out rollouts are generated) and train what a clean run does
    reused = _train(policy, tmp_path / "s")
    assert generations == [2]
    clean = _train(policy, tmp_path / "clean")
    assert all(torch.equal(reused[k], clean[k]) for k in clean)


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"trainer": dataclasses.replace(CFG.trainer, lr=3e-3)}, r"\(drafter_trainer.lr\): drafter_trainer.lr=0.001"),
        ({"epochs": 2}, r"\(epochs\): epochs=1 \(now 2\)"),
    ],
)
def test_other_training_settings_train_the_kept_shards_again(policy, tmp_path, change, shown, generations):
    """A setting of the training alone (the learning rate, what a diverged run is told to lower; the epochs; the
    draft vocabulary) does not change the shards: it was refused like a rollout setting, with the advice to delete
    the shards and generate them all again. It is refused against the saved training only, whose deletion keeps the
    shards: the run then trains them with its settings, generating nothing but the held-out rollouts, as a clean
    run of those settings does."""
    _train(policy, tmp_path / "s")
    kept, generations[:] = _files(tmp_path / "s"), []
    cfg = dataclasses.replace(CFG, **change)
    with pytest.raises(ValueError, match=f"s holds a training of its shards with other settings {shown}") as err:
        _train(policy, tmp_path / "s", cfg)
    assert f"delete {tmp_path / 's' / 'resume'} to train this stream from its first shard again" in str(err.value)
    assert generations == [] and _files(tmp_path / "s") == kept
    shutil.rmtree(tmp_path / "s" / "resume")
    retrained = _train(policy, tmp_path / "s", cfg)
    assert generations == [2]  # the held-out rollouts only: the shards were read back
    clean = _train(policy, tmp_path / "clean", cfg)
    assert all(torch.equal(retrained[k], clean[k]) for k in clean)


def test_shards_without_a_record_of_their_settings_are_refused_and_kept(policy, tmp_path, generations):
    """Shards an earlier version left without any record (killed before its first save) may come from any settings:
    they are named, not read back, not deleted."""
    _train(policy, tmp_path / "old")
    (tmp_path / "s").mkdir()
    for name in ("shard_00000.json", "shard_00001.json"):
        shutil.copy(tmp_path / "old" / name, tmp_path / "s" / name)
    generations[:] = []
    with pytest.raises(ValueError, match=r"holds rollout shards \(shard_00000.json, shard_00001.json\) but no record"):
        _train(policy, tmp_path / "s", dataclasses.replace(CFG, seed=7))
    assert generations == [] and sorted(_files(tmp_path / "s")) == ["shard_00000.json", "shard_00001.json"]


def test_a_refused_resume_generates_nothing_and_names_each_setting(policy, tmp_path, generations):
    """The settings are checked before the held-out rollouts (it used to be after them), and the refusal names each
    setting, nested trainer keys included, with the stream's value and this run's."""
    _train(policy, tmp_path / "s")
    generations[:] = []
    other = dataclasses.replace(CFG, seed=3, trainer=dataclasses.replace(CFG.trainer, lr=0.5))
    with pytest.raises(
        ValueError, match=r"\(seed, drafter_trainer.lr\): seed=0 \(now 3\), drafter_trainer.lr=0.001 \(now 0.5\)"
    ):
        _train(policy, tmp_path / "s", other)
    assert generations == []


def test_the_settings_are_recorded_before_the_first_shard_and_a_bare_record_is_replaced(policy, tmp_path, monkeypatch):
    """A run killed while generating its first shard leaves the record (and no shard): a run of other settings then
    has nothing to mix in, so it replaces the record instead of being refused."""
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    real = RolloutPlan.generate

    def killed(self, *args, **kwargs):
        assert json.loads((tmp_path / "s" / "fingerprint.json").read_text()) == {"k": 1}
        raise KeyboardInterrupt

    monkeypatch.setattr(RolloutPlan, "generate", killed)
    with pytest.raises(KeyboardInterrupt):
        make_run(policy, tmp_path / "s", drafter, []).run({"k": 1})
    monkeypatch.setattr(RolloutPlan, "generate", real)
    assert make_run(policy, tmp_path / "s", drafter, []).run({"k": 2}, stop_after_shards=1).shard == 1
    assert json.loads((tmp_path / "s" / "fingerprint.json").read_text()) == {"k": 2}
    with pytest.raises(ValueError, match=r"other settings \(k\): k=2 \(now 1\)"):
        make_run(policy, tmp_path / "s", drafter, []).run({"k": 1})


def test_a_stream_saved_before_settings_were_recorded_resumes_on_its_state(policy, tmp_path):
    """A stream an earlier version saved has its settings in its state only: it resumes on them (and records them),
    and is refused for other settings."""
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    make_run(policy, tmp_path / "s", drafter, []).run({"k": 1}, stop_after_shards=1)
    (tmp_path / "s" / "fingerprint.json").unlink()
    with pytest.raises(ValueError, match=r"other settings \(k\): k=1 \(now 2\)"):
        make_run(policy, tmp_path / "s", drafter, []).run({"k": 2})
    assert not (tmp_path / "s" / "fingerprint.json").exists()
    assert make_run(policy, tmp_path / "s", drafter, []).run({"k": 1}, stop_after_shards=1).shard == 2
    assert json.loads((tmp_path / "s" / "fingerprint.json").read_text()) == {"k": 1}


def test_the_measuring_temperature_is_resumable_where_rollout_temperatures_set_every_pass(policy, tmp_path):
    """With rollout_temperatures given, ``temperature`` only chooses the held-out accept length's temperature: a
    resume that changes it was refused as if its shards had been generated with it; without them it still is."""
    passes = dataclasses.replace(CFG, rollout_temperatures=[0.0, 1.0])
    _train(policy, tmp_path / "s", passes)
    _train(policy, tmp_path / "s", dataclasses.replace(passes, temperature=0.0))  # resumed: nothing changed
    _train(policy, tmp_path / "t")
    with pytest.raises(ValueError, match=r"other settings \(temperature\): temperature=1.0 \(now 0.0\)"):
        _train(policy, tmp_path / "t", dataclasses.replace(CFG, temperature=0.0))
