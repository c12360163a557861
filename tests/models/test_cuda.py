"""The decoder and KV cache on a CUDA device agree with the CPU (skipped where no CUDA device exists)."""

from __future__ import annotations

import pytest
import torch

from fastrl.models import KVCache, load_model


@pytest.mark.gpu
@pytest.mark.parametrize("flavour_name", ["llama_gqa", "qwen3"])
def test_cuda_incremental_decoding_matches_cpu(hf_checkpoint, flavour_name):
    _, path = hf_checkpoint(flavour_name)
    cpu, gpu = load_model(path), load_model(path, device="cuda")
    config = cpu.config
    ids = torch.randint(0, config.vocab_size, (2, 10))
    pos = torch.arange(10).expand(2, 10)
    with torch.no_grad():
        want = cpu(ids, pos).logits
        cache = KVCache(config.num_hidden_layers, 2, 16, config.num_key_value_heads, config.head_dim, device="cuda")
        # CPU slot ids (contiguous: read as views) and CUDA slot ids (gathered, no host sync).
        for slots in (torch.tensor([0, 1]), torch.tensor([1, 0], device="cuda")):
            first = gpu(ids[:, :6].cuda(), pos[:, :6].cuda(), cache, slots)
            rest = gpu(ids[:, 6:].cuda(), pos[:, 6:].cuda(), cache, slots, kv_len=10)
            got = torch.cat([first.logits, rest.logits], 1).cpu()
            assert (got - want).abs().max() <= 1e-3
