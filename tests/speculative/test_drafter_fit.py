"""check_drafter_fit: a drafter that does not fit its policy is one ValueError giving both sides of each mismatch."""

from __future__ import annotations

import re

import pytest

from fastrl.models.config import ModelConfig
from fastrl.speculative.drafter_checkpoint import DrafterInfo, check_drafter_fit


def _info(layer: ModelConfig) -> DrafterInfo:
    """A drafter's info for a policy of ``layer``'s hidden size and vocabulary."""
    return DrafterInfo("tiny", layer.hidden_size, layer.vocab_size, 0, layer)


def test_a_head_geometry_mismatch_gives_both_triples():
    """It said only 'attention head geometry differs from the policy's', where the sizes' mismatches give numbers."""
    policy = ModelConfig("llama", 97, 64, 96, 2, 4, num_key_value_heads=2, head_dim=16)
    layer = ModelConfig("llama", 97, 64, 96, 1, 4, num_key_value_heads=1, head_dim=32)
    expected = "(num_attention_heads, num_key_value_heads, head_dim) (4, 1, 32) != policy's (4, 2, 16)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        check_drafter_fit("d", _info(layer), policy)
    check_drafter_fit("d", _info(ModelConfig("llama", 97, 64, 96, 1, 4, 2, 16)), policy)
