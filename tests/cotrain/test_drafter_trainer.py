"""DrafterTrainer's inputs: an empty batch is one clear error, and a non-finite feature is refused by evaluation as
it is by a training step (never NaN metrics)."""

from __future__ import annotations

import pytest
import torch

from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.features import policy_features
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    policy = load_model(path).eval()
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config).eval()
    g = torch.Generator().manual_seed(2)
    seqs = policy_features(policy, [torch.randint(3, 97, (n,), generator=g).tolist() for n in (9, 12)])
    return policy, drafter, seqs


def test_an_empty_batch_is_one_clear_error(setup):
    policy, drafter, _ = setup
    trainer = DrafterTrainer(drafter, policy, DrafterTrainerConfig(feature_noise=0.0))
    with pytest.raises(ValueError, match="no sequences"):
        trainer.train_step([])
    assert trainer.step_count == 0
