"""`fastrl train-drafter extra_layers=[...]`: a drafter reading EAGLE-3's fused input (low, middle and last policy
layers), started from a last-layer drafter as exactly that drafter, with bad layer settings (and bad accept
strategies or draft vocabulary sizes) named before any work."""

from __future__ import annotations

import re

import pytest
import torch

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.cli import main
from fastrl.commands.train_drafter import initial_drafter
from fastrl.commands.train_drafter_config import TrainDrafterConfig
from fastrl.cotrain.features import policy_features
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from tests.helpers import write_last_layer_drafter


@pytest.fixture(scope="module")
def policy():
    return load_model(bundled_model_dir()).eval()


def test_a_last_layer_init_drafter_becomes_a_fused_one_that_drafts_the_same(policy, tmp_path):
    init = write_last_layer_drafter(tmp_path / "last")
    fused = initial_drafter(policy, TrainDrafterConfig(init_drafter=str(init), extra_layers=[1, 3])).eval()
    base = load_drafter(init, policy)[0].float().eval()
    assert isinstance(fused, FusedEagleDrafter) and fused.extra_layers == (1, 3)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, policy.config.vocab_size, (40,), generator=g).tolist()
    wide = policy_features(policy, [ids], extra_layers=(1, 3))[0]
    last = policy_features(policy, [ids])[0]
    h = policy.config.hidden_size
    assert wide.features.shape[-1] == 3 * h and torch.equal(wide.features[:, -h:], last.features)
    tokens, positions = wide.tokens.unsqueeze(0), torch.arange(len(wide.tokens)).unsqueeze(0)
    with torch.no_grad():
        a = fused(policy, tokens, wide.features.unsqueeze(0), positions)
        b = base(policy, tokens, last.features.unsqueeze(0), positions)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # Training moves the fuse off the identity: the lower layers then matter.
    with torch.no_grad():
        fused.fuse.weight[:, :h] += 0.1
        moved = fused(policy, tokens, wide.features.unsqueeze(0), positions)
    assert (moved - b).abs().max() > 1e-3


def test_a_fresh_fused_drafter_and_bad_layers(policy):
    count = policy.config.num_hidden_layers
    assert isinstance(initial_drafter(policy, TrainDrafterConfig(extra_layers=[1])), FusedEagleDrafter)
    outside = rf"train_drafter.extra_layers \[0, {count}\] lie outside the policy's {count}"
    with pytest.raises(ValueError, match=outside):
        initial_drafter(policy, TrainDrafterConfig(extra_layers=[0, count]))
    shipped = str(bundled_drafter_dir())  # reads layers 0 and 2: kept as it is, or refused for other layers
    assert initial_drafter(policy, TrainDrafterConfig(init_drafter=shipped, extra_layers=[0, 2])).extra_layers == (0, 2)
    with pytest.raises(ValueError, match=r"reads layers \[0, 2\] \+ the last; extra_layers=\[1\] differs"):
        initial_drafter(policy, TrainDrafterConfig(init_drafter=shipped, extra_layers=[1]))
    for bad in ([2, 0], [1, 1], [-1]):
        with pytest.raises(ValueError, match="train_drafter.extra_layers must be"):
            TrainDrafterConfig(extra_layers=bad)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("accept_strategies=[bandit]", "train_drafter.accept_strategies: strategy 'bandit'"),
        ("accept_strategies=[disable]", "'disable' drafts nothing"),
        ("accept_strategies=[]", "name at least one strategy"),
        ("accept_strategies=[3_1_4,suffix_8]", r"\['suffix_8'\] draft from the rollouts' history"),
        ("draft_vocab_size=100000", r"train_drafter.draft_vocab_size must be in \[0, 91\]"),
        # the measurement at the first epoch's end refused it, after the training, and no drafter was written
        ("draft_vocab_size=3", r"accept_strategies: \['8_4_32'\] draft more candidates a step than the 3 tokens"),
        ("rollout_temperatures=[0,inf]", r"train_drafter.rollout_temperatures must be finite numbers >= 0, got inf"),
        ("temperature=-1", r"train_drafter.temperature must be finite numbers >= 0, got -1"),
        # a second greedy pass generated and trained the same rollouts again
        ("rollout_temperatures=[0,1,0]", r"train_drafter.rollout_temperatures names \[0.0\] more than once"),
    ],
)
def test_settings_found_bad_only_after_training_are_refused_before_any_rollout(tmp_path, capsys, override, message):
    """A bad accept strategy used to end the run after the whole training (and a too-large draft vocabulary after
    the first shard's rollouts): both are now one error before anything is generated or written."""
    output = tmp_path / "drafter"
    args = [f"output={output}", "num_prompts=4", "eval_prompts=2", "epochs=1", "max_new_tokens=8", override]
    assert main(["train-drafter", *args]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not output.exists() and not (tmp_path / "drafter.stream").exists()


def test_a_draft_vocab_size_other_than_the_init_drafters_is_refused(policy, tmp_path):
    """The init drafter's draft vocabulary is kept: another draft_vocab_size was silently ignored."""
    from fastrl.speculative.drafter_checkpoint import save_drafter

    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    drafter.set_draft_vocab(torch.arange(40))
    save_drafter(drafter, tmp_path / "init", "arith-tiny")
    init = str(tmp_path / "init")
    kept = initial_drafter(policy, TrainDrafterConfig(init_drafter=init, extra_layers=[0, 2], draft_vocab_size=40))
    assert kept.draft_vocab.numel() == 40
    with pytest.raises(ValueError, match=r"draft_vocab_size=20, but init_drafter=.* drafts over its own 40 tokens"):
        initial_drafter(policy, TrainDrafterConfig(init_drafter=init, extra_layers=[0, 2], draft_vocab_size=20))


def test_engines_that_cannot_fit_are_refused_before_the_policy_loads_naming_their_batch_key(monkeypatch):
    """The measuring engine's KV cache failed to allocate at the first epoch's end (after the training), naming
    engine keys train-drafter does not have. Each engine holds a slot per request, at most its batch size."""
    import fastrl.commands.engine_setup as engine_setup
    from fastrl.commands.train_drafter import check_engine_memory
    from fastrl.models.checkpoint import read_config
    from fastrl.models.kv_cache import KvShape

    config = read_config(bundled_model_dir())
    train, held = [[1, 5, 6]] * 6, [[1, 7]] * 40
    cfg = TrainDrafterConfig(max_new_tokens=96, gen_batch_size=10**9, accept_batch_size=10**9, accept_requests=16)
    slot = KvShape(config.num_hidden_layers, config.num_key_value_heads, config.head_dim).entry_bytes(torch.float32) * (
        3 + 96 + 1
    )  # the longest prompt + max_new_tokens + 1 entries
    monkeypatch.setattr(engine_setup, "available_bytes", lambda device: 16 * slot)
    check_engine_memory(cfg, config, train, held)  # 6 generating slots, 16 measuring ones: they fit
    monkeypatch.setattr(engine_setup, "available_bytes", lambda device: 15 * slot)
    with pytest.raises(ValueError, match=r"^train_drafter.accept_batch_size=16 needs a .* use train_drafter"):
        check_engine_memory(cfg, config, train, held)
    monkeypatch.setattr(engine_setup, "available_bytes", lambda device: 5 * slot)
    with pytest.raises(ValueError, match=r"^train_drafter.gen_batch_size=6 needs a"):
        check_engine_memory(cfg, config, train, held)
