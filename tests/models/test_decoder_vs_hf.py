"""CausalLM forward (full sequence and incremental through the KV cache) equals transformers' in fp32."""

from __future__ import annotations

import pytest
import torch

from fastrl.models import CausalLM, KVCache, load_model

TOL = 1e-4


def hf_forward(hf, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF logits and last_hidden_state for a full sequence.  # [B,T] -> [B,T,V], [B,T,H]"""
    with torch.no_grad():
        return hf(ids).logits, hf.model(ids).last_hidden_state


def new_cache(model: CausalLM, num_slots: int = 3, max_len: int = 32) -> KVCache:
    c = model.config
    return KVCache(c.num_hidden_layers, num_slots, max_len, c.num_key_value_heads, c.head_dim)


def test_full_forward_matches_hf(hf_checkpoint, flavour):
    hf, path = hf_checkpoint(flavour)
    model = load_model(path)
    ids = torch.randint(0, model.config.vocab_size, (2, 13))
    logits, hidden = hf_forward(hf, ids)
    with torch.no_grad():
        out = model(ids, torch.arange(13).expand(2, 13))
    assert (out.logits - logits).abs().max() <= TOL
    assert (out.hidden - hidden).abs().max() <= TOL
    assert torch.equal(model.logits(out.hidden), out.logits)
    assert torch.equal(model.embed(ids), hf.model.embed_tokens(ids))
    assert model(ids, torch.arange(13).expand(2, 13), compute_logits=False).logits is None


@pytest.mark.parametrize("slot_ids", [[2, 0], [1, 2]])
def test_incremental_decoding_matches_hf(hf_checkpoint, flavour, slot_ids):
    """Prefill 5, then 3 single tokens (default causal mask), then a chunk of 4 with explicit cache_index/mask."""
    hf, path = hf_checkpoint(flavour)
    model = load_model(path)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    logits, hidden = hf_forward(hf, ids)
    cache, slots = new_cache(model), torch.tensor(slot_ids)
    pos = torch.arange(12).expand(2, 12)
    steps = [(0, 5), (5, 6), (6, 7), (7, 8)]
    got_logits, got_hidden = [], []
    with torch.no_grad():
        for a, b in steps:
            out = model(ids[:, a:b], pos[:, a:b], cache, slots)
            got_logits.append(out.logits)
            got_hidden.append(out.hidden)
        index = pos[:, 8:12]
        mask = (torch.arange(16) <= index.unsqueeze(-1)).expand(2, 4, 16)
        out = model(ids[:, 8:], pos[:, 8:], cache, slots, cache_index=index, attn_mask=mask)
    assert (torch.cat([*got_logits, out.logits], 1) - logits).abs().max() <= TOL
    assert (torch.cat([*got_hidden, out.hidden], 1) - hidden).abs().max() <= TOL


def test_ragged_batch_decoding_matches_hf(hf_checkpoint):
    """Rows at different lengths decode together; each row equals HF run on that row alone."""
    hf, path = hf_checkpoint("llama_gqa")
    model = load_model(path)
    lengths = [9, 6]
    seqs = [torch.randint(0, 97, (1, n + 3)) for n in lengths]
    cache, slots = new_cache(model), torch.tensor([1, 0])
    with torch.no_grad():
        prompt = torch.zeros(2, 9, dtype=torch.long)
        for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
            prompt[row, :n] = seq[0, :n]
        model(prompt, torch.arange(9).expand(2, 9), cache, slots)  # row 1's padding lands at 6..8, never seen
        outs = []
        for step in range(3):
            ids = torch.stack([seq[0, n + step] for seq, n in zip(seqs, lengths, strict=True)]).unsqueeze(1)
            pos = torch.tensor(lengths).unsqueeze(1) + step
            outs.append(model(ids, pos, cache, slots).logits)
    got = torch.cat(outs, 1)
    for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
        want, _ = hf_forward(hf, seq)
        assert (got[row] - want[0, n:]).abs().max() <= TOL


def test_padding_row_is_finite_and_isolated(hf_checkpoint):
    _, path = hf_checkpoint("qwen3")
    model = load_model(path)
    ids = torch.randint(0, 97, (2, 6))
    pos = torch.arange(6).expand(2, 6)
    mask = torch.ones(6, 6, dtype=torch.bool).tril().repeat(2, 1, 1)
    mask[1] = False
    cache = new_cache(model)
    with torch.no_grad():
        out = model(ids, pos, attn_mask=mask)
        alone = model(ids[:1], pos[:1])
        cached = model(ids, pos, cache, torch.tensor([0, 1]), attn_mask=torch.cat([mask, mask[:, :, :2] & False], -1))
    assert torch.isfinite(out.logits).all() and torch.isfinite(cached.logits).all()
    assert (out.logits[0] - alone.logits[0]).abs().max() <= TOL
    assert (cached.logits[0] - alone.logits[0]).abs().max() <= TOL


def test_bad_forward_arguments_raise(hf_checkpoint):
    _, path = hf_checkpoint("llama_gqa")
    model = load_model(path)
    ids, pos = torch.zeros(1, 4, dtype=torch.long), torch.arange(4).unsqueeze(0)
    with pytest.raises(ValueError, match="slots"):
        model(ids, pos, new_cache(model))
    with pytest.raises(ValueError, match="positions"):
        model(ids, pos[:, :3])
    with pytest.raises(ValueError, match="attn_mask"):
        model(ids, pos, attn_mask=torch.ones(1, 4, 4))
    with pytest.raises(ValueError, match="max_len"):
        model(ids, pos, new_cache(model, max_len=8), torch.tensor([0]), kv_len=9)


def test_random_init_has_hf_names_and_tied_head():
    from fastrl.models import ModelConfig

    config = ModelConfig("qwen3", 50, 32, 64, 2, 4, 2, tie_word_embeddings=True)
    model = CausalLM(config)
    names = set(dict(model.named_parameters()))
    assert "model.layers.1.self_attn.q_norm.weight" in names and "model.layers.0.self_attn.o_proj.weight" in names
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" in model.state_dict()


def test_standalone_decoder_layer_with_its_own_cache(hf_checkpoint):
    """How the EAGLE drafter uses a layer: own 1-layer KVCache, own rope/mask, incremental == full."""
    from fastrl.models import DecoderLayer, RotaryEmbedding, attention_mask

    _, path = hf_checkpoint("qwen3")
    model = load_model(path)
    config = model.config
    layer = DecoderLayer(config, 0).eval()
    layer.load_state_dict(model.model.layers[1].state_dict())
    rope = RotaryEmbedding(config)
    x = torch.randn(2, 7, config.hidden_size)
    pos = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        cos, sin = rope(pos, x.dtype)
        full = layer(x, cos, sin)
        assert torch.equal(full, layer(x, cos, sin, attn_mask=attention_mask(pos)))
        cache = KVCache(1, 2, 16, config.num_key_value_heads, config.head_dim)
        slots = torch.tensor([1, 0])
        head = pos[:, :4]
        first = layer(x[:, :4], cos[:, :4], sin[:, :4], cache, slots, head, attention_mask(head, head))
        raw = torch.arange(7) <= pos[:, 4:, None]  # [B,3,7] unprepared mask is accepted too
        rest = layer(x[:, 4:], cos[:, 4:], sin[:, 4:], cache, slots, pos[:, 4:], raw)
    assert (torch.cat([first, rest], 1) - full).abs().max() <= TOL
    no_norm = DecoderLayer(config, 0, input_norm=False)
    assert not any(name.startswith("input_layernorm") for name in no_norm.state_dict())
