"""`fastrl export-drafter`: the exported EAGLE checkpoint, run by an independent re-implementation of SGLang's
EAGLE draft forward, gives fastrl's draft logits; the vLLM variant and the learned-selection configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.assets_path import assets_dir, bundled_drafter_dir, bundled_model_dir
from fastrl.cli import main
from fastrl.integrations.export.eagle_checkpoint import export_eagle_drafter
from fastrl.integrations.export.selection_config import SELECTION_FILES, write_selection_configs
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy
from tests.helpers import write_last_layer_drafter


class SglangEagleDraft:
    """SGLang's EAGLE draft model for Llama, re-implemented from ``sglang/srt/models/llama_eagle.py`` and the
    decoder layer of ``sglang/srt/models/llama.py``, in plain torch, reading the exported checkpoint by its names:

    h = fc(cat(embed(ids), hidden)); layer 0 without input_layernorm: residual = h, h = self_attn(h);
    residual = h + residual, h = post_attention_layernorm(residual); h = mlp(h); out = h + residual (no final norm);
    logits = lm_head(out), with embed and lm_head the target's.
    """

    def __init__(self, tensors: dict[str, Tensor], config: dict, embed: Tensor, lm_head: Tensor) -> None:
        self.w = {k: v.float() for k, v in tensors.items()}
        self.c = config
        self.embed, self.lm_head = embed.float(), lm_head.float()

    def rms_norm(self, x: Tensor, weight: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * weight

    def rope(self, x: Tensor, positions: Tensor) -> Tensor:  # x [S, heads, D], neox-style halves
        d = x.shape[-1]
        inv = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        angles = positions.float()[:, None] * inv[None, :]
        cos, sin = torch.cat([angles, angles], -1).cos()[:, None, :], torch.cat([angles, angles], -1).sin()[:, None, :]
        rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
        return x * cos + rotated * sin

    def attention(self, h: Tensor, positions: Tensor) -> Tensor:
        p, c = "layers.0.self_attn.", self.c
        heads, kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        q = F.linear(h, self.w[p + "q_proj.weight"]).view(-1, heads, d)
        k = F.linear(h, self.w[p + "k_proj.weight"]).view(-1, kv, d)
        v = F.linear(h, self.w[p + "v_proj.weight"]).view(-1, kv, d)
        q, k = self.rope(q, positions), self.rope(k, positions)
        k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        scores = torch.einsum("shd,thd->hst", q, k) / d**0.5
        causal = positions[None, :, None] >= positions[None, None, :]
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out = torch.einsum("hst,thd->shd", probs, v).reshape(h.shape[0], heads * d)
        return F.linear(out, self.w[p + "o_proj.weight"])

    def logits(self, input_ids: Tensor, positions: Tensor, hidden_states: Tensor) -> Tensor:
        """# input_ids [S], positions [S], hidden_states [S,H] -> draft logits [S,V]"""
        h = F.linear(torch.cat([self.embed[input_ids], hidden_states.float()], -1), self.w["fc.weight"])
        h = h + self.w["fc.bias"]
        residual = h
        h = self.attention(h, positions)
        residual = h + residual
        h = self.rms_norm(residual, self.w["layers.0.post_attention_layernorm.weight"])
        m = "layers.0.mlp."
        h = F.linear(F.silu(F.linear(h, self.w[m + "gate_proj.weight"])) * F.linear(h, self.w[m + "up_proj.weight"]),
                     self.w[m + "down_proj.weight"])  # fmt: skip
        return F.linear(h + residual, self.lm_head)


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory) -> Path:
    """The shipped drafter's last-layer part: the shipped one reads a fused input, which these formats cannot hold."""
    return write_last_layer_drafter(tmp_path_factory.mktemp("last_layer_drafter"))


@pytest.fixture(scope="module")
def models(drafter_dir):
    policy = load_model(bundled_model_dir())
    drafter, _ = load_drafter(drafter_dir, policy)
    return policy, drafter


def _fastrl_and_sglang_logits(models, out_dir) -> tuple[Tensor, Tensor]:
    policy, drafter = models
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, policy.config.vocab_size, (12,), generator=g)
    features = torch.randn(12, policy.config.hidden_size, generator=g)
    positions = torch.arange(1, 13)
    with torch.no_grad():
        ours = policy.lm_head(drafter(policy, tokens[None], features[None], positions[None]))[0]
        config = json.loads((out_dir / "config.json").read_text())
        sglang = SglangEagleDraft(
            load_file(str(out_dir / "model.safetensors")),
            config,
            policy.model.embed_tokens.weight,
            policy.lm_head.weight,
        )
        theirs = sglang.logits(tokens, positions, features)
    return ours, theirs


def test_sglang_checkpoint_layout(drafter_dir, models, tmp_path):
    exported = export_eagle_drafter(drafter_dir, tmp_path, "sglang")
    config = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert config["architectures"] == ["LlamaForCausalLMEagle"] and config["num_hidden_layers"] == 1
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight"} <= set(tensors)
    assert not any("input_layernorm" in k or k.startswith(("norm.", "embed_tokens", "lm_head")) for k in tensors)
    assert all(t.dtype == torch.bfloat16 for t in tensors.values()) and exported.dtype == "bfloat16"


def test_exported_drafter_gives_fastrl_draft_logits_in_sglang_forward(drafter_dir, models, tmp_path):
    export_eagle_drafter(drafter_dir, tmp_path / "f32", "sglang", dtype="float32")
    ours, theirs = _fastrl_and_sglang_logits(models, tmp_path / "f32")
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    export_eagle_drafter(drafter_dir, tmp_path / "bf16", "sglang")  # the default: bf16 weights
    ours, theirs = _fastrl_and_sglang_logits(models, tmp_path / "bf16")
    assert (theirs.argmax(-1) == ours.argmax(-1)).float().mean() >= 0.9
    assert (theirs - ours).abs().max() < 0.05 * ours.abs().max()


def test_vllm_export_names_the_target_architecture_and_refuses_a_silent_bias_drop(drafter_dir, tmp_path):
    with pytest.raises(ValueError, match="drop_fc_bias"):
        export_eagle_drafter(drafter_dir, tmp_path, "vllm")
    exported = export_eagle_drafter(drafter_dir, tmp_path, "vllm", drop_fc_bias=True)
    assert exported.architecture == "LlamaForCausalLM" and "fc.bias" not in exported.tensor_names
    with pytest.raises(ValueError, match="export_drafter.format"):
        export_eagle_drafter(drafter_dir, tmp_path, "trtllm")


@pytest.fixture(scope="module")
def narrow_drafter_dir(tmp_path_factory) -> Path:
    """The last-layer drafter with a 24-token draft vocabulary (ids out of order): its LM head is those rows."""
    from fastrl.speculative.drafter_checkpoint import save_drafter
    from tests.helpers import last_layer_drafter

    policy = load_model(bundled_model_dir())
    drafter = last_layer_drafter(policy)
    ids = torch.randperm(policy.config.vocab_size, generator=torch.Generator().manual_seed(3))[:24]
    drafter.set_draft_vocab(ids)
    directory = tmp_path_factory.mktemp("narrow_drafter")
    save_drafter(drafter, directory, "arith-tiny", version=1)
    return directory


def test_a_draft_vocabulary_becomes_sglangs_token_map(narrow_drafter_dir, tmp_path, capsys):
    """SGLang's --speculative-token-map restricts the shared LM head to the map's rows and maps draft index i to
    ids[i]: with the exported map, SGLang's draft picks fastrl's draft tokens. vLLM has no map: refused unless
    full_vocab=true."""
    policy = load_model(bundled_model_dir())
    drafter, _ = load_drafter(narrow_drafter_dir, policy)
    exported = export_eagle_drafter(narrow_drafter_dir, tmp_path / "sg", "sglang", dtype="float32")
    assert exported.token_map == tmp_path / "sg" / "hot_token_ids.pt" and exported.draft_vocab_size == 24
    hot = torch.load(exported.token_map, weights_only=True)  # as SGLang's load_token_map reads it
    assert torch.equal(hot, drafter.draft_vocab)
    config = json.loads((tmp_path / "sg" / "config.json").read_text())
    assert config["fastrl"]["draft_vocab_size"] == 24 and config["fastrl"]["token_map"] == "hot_token_ids.pt"
    assert "hot_vocab_size" not in config  # SGLang sets it itself from the map it is given
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, policy.config.vocab_size, (10,), generator=g)
    features = torch.randn(10, policy.config.hidden_size, generator=g)
    positions = torch.arange(1, 11)
    with torch.no_grad():
        ours = drafter.draft_logits(policy, drafter(policy, tokens[None], features[None], positions[None]))[0]
        sglang = SglangEagleDraft(
            load_file(str(tmp_path / "sg" / "model.safetensors")),
            config,
            policy.model.embed_tokens.weight,
            policy.lm_head.weight[hot],
        )
        theirs = sglang.logits(tokens, positions, features)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    assert torch.equal(hot[theirs.argmax(-1)], drafter.draft_vocab[ours.argmax(-1)])
    with pytest.raises(ValueError, match="export_drafter.full_vocab: .* 24-token draft vocabulary"):
        export_eagle_drafter(narrow_drafter_dir, tmp_path / "v", "vllm", drop_fc_bias=True)
    assert not (tmp_path / "v").exists()
    exported = export_eagle_drafter(narrow_drafter_dir, tmp_path / "v", "vllm", drop_fc_bias=True, full_vocab=True)
    assert exported.token_map is None and not (tmp_path / "v" / "hot_token_ids.pt").exists()
    assert exported.draft_vocab_size is None, "vLLM drafts over the whole vocabulary"
    assert json.loads((tmp_path / "v" / "config.json").read_text())["fastrl"]["draft_vocab_size"] is None
    out = tmp_path / "cli"
    assert main(["export-drafter", str(narrow_drafter_dir), str(out)]) == 0
    assert f"--speculative-token-map {out / 'hot_token_ids.pt'}" in capsys.readouterr().out


def _trained_bandit_state() -> dict:
    """A bandit that saw speculation pay at batch size 1 and plain decoding win at 32."""
    bandit = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], bs_thresholds=[1, 2, 5, 21], epsilon=0.0))
    spec = Strategy.parse("3_1_4")
    for _ in range(6):
        bandit.observe(RoundStats(spec, 1, [3], [3], [4], 0.010))
        bandit.observe(RoundStats(spec, 32, [3] * 32, [3] * 32, [4] * 32, 0.160))  # same acceptance, 8x the cost
        bandit.observe(RoundStats(DISABLE, 1, [0], [0], [1], 0.008))
        bandit.observe(RoundStats(DISABLE, 32, [0] * 32, [0] * 32, [1] * 32, 0.020))
    return bandit.state_dict()


def test_cli_writes_checkpoint_and_selection_configs(drafter_dir, tmp_path):
    state = tmp_path / "bandit_state.json"
    state.write_text(json.dumps(_trained_bandit_state()))
    out = tmp_path / "out"
    code = main(["export-drafter", str(drafter_dir), str(out), "--format", "sglang", f"bandit_state={state}"])
    assert code == 0 and (out / "model.safetensors").is_file()
    vllm = json.loads((out / "vllm_speculative_config.json").read_text())
    assert vllm["num_speculative_tokens_per_batch_size"]["1"] == 3
    assert vllm["num_speculative_tokens_per_batch_size"]["21"] == 0
    sglang = json.loads((out / "sglang_adaptive_config.json").read_text())
    assert sglang["1"]["speculative_num_steps"] == 3 and sglang["21"]["disable"]
    winners = write_selection_configs(state, tmp_path / "again", "draft")
    assert [str(w.strategy) for w in winners][0] == "3_1_4" and str(winners[-1].strategy) == "disable"
    assert main(["export-drafter", str(drafter_dir), str(out), "--format", "onnx"]) == 2


def test_an_arm_the_run_barely_tried_is_exported_as_the_run_predicted_it_with_the_drafters_prior(drafter_dir, tmp_path):
    """The engine gives the bandit its drafter's held-out chain hazard at start (``metrics.json``); the saved state
    does not hold it. The export rebuilt the bandit from the state alone, so an arm with one round behind it was
    predicted from an acceptance of 1/2 a depth: a drafter that accepts nothing was exported as worth drafting."""
    bandit = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], bs_thresholds=[1, 2, 5, 21], epsilon=0.0))
    bandit.observe(RoundStats(Strategy.parse("3_1_4"), 1, [3], [1], [2], 0.015))
    for _ in range(6):
        bandit.observe(RoundStats(DISABLE, 1, [0], [0], [1], 0.008))
    state = tmp_path / "bandit_state.json"
    state.write_text(json.dumps(bandit.state_dict()))
    weak = shutil.copytree(drafter_dir, tmp_path / "weak")
    record = {"strategy": "3_1_4", "temperature": 1.0, "mean_accept_length": 1.05, "mean_accepted_drafts": 0.05}
    (weak / "metrics.json").write_text(json.dumps({"accept_lengths": [record]}))
    assert main(["export-drafter", str(weak), str(tmp_path / "out"), f"bandit_state={state}"]) == 0
    winners = json.loads((tmp_path / "out" / "bandit_winners.json").read_text())
    assert winners[0]["strategy"] == "disable"  # 3_1_4 at 1/2 a depth: 142 tokens/s against plain's 125


def test_an_overwrite_leaves_no_file_of_the_export_before(drafter_dir, narrow_drafter_dir, tmp_path):
    """overwrite=true keeps a user's other files, but not an earlier export's token map or selection configs: they
    would restrict or steer the new drafter (a full-vocabulary drafter served with a 24-token map)."""
    state = tmp_path / "bandit_state.json"
    state.write_text(json.dumps(_trained_bandit_state()))
    out = tmp_path / "out"
    assert main(["export-drafter", str(narrow_drafter_dir), str(out), f"bandit_state={state}"]) == 0
    (out / "README.md").write_text("mine")
    assert (out / "hot_token_ids.pt").is_file() and (out / "bandit_winners.json").is_file()
    assert main(["export-drafter", str(drafter_dir), str(out), "overwrite=true"]) == 0
    left = sorted(p.name for p in out.iterdir())
    assert "hot_token_ids.pt" not in left and not set(SELECTION_FILES) & set(left)
    assert "README.md" in left and json.loads((out / "config.json").read_text())["fastrl"]["token_map"] is None


def test_export_from_a_train_checkpoint_merges_every_worker_and_says_why_a_bucket_is_disabled(
    drafter_dir, tmp_path, capsys
):
    """A `fastrl train` checkpoint's rollout_selector.json ({"workers": [state, ...]}) is read with all workers'
    observations merged; a bucket whose winner is a history arm or plain decoding says why it is disabled."""
    config = BanditConfig(strategies=["3_1_4", "suffix_8", "disable"], bs_thresholds=[1, 2, 5, 21], epsilon=0.0)
    spec, suffix = Strategy.parse("3_1_4"), Strategy.parse("suffix_8")
    workers = [BanditSelector(config), BanditSelector(config)]
    for _ in range(4):  # worker 0 sees only batch size 1 (suffix_8 wins), worker 1 only 32 (plain decoding wins)
        for s, t in ((spec, 0.010), (suffix, 0.005), (DISABLE, 0.012)):
            d = 3 * (s != DISABLE)
            workers[0].observe(RoundStats(s, 1, [d], [d], [1 + d], t))
        for s, t in ((spec, 0.080), (suffix, 0.090), (DISABLE, 0.020)):
            workers[1].observe(RoundStats(s, 32, [3 * (s != DISABLE)] * 32, [0] * 32, [1] * 32, t))
    state = tmp_path / "rollout_selector.json"
    state.write_text(json.dumps({"workers": [w.state_dict() for w in workers]}))
    out = tmp_path / "out"
    assert main(["export-drafter", str(drafter_dir), str(out), f"bandit_state={state}"]) == 0
    sglang = json.loads((out / "sglang_adaptive_config.json").read_text())
    assert sglang["1"]["disable"] and "suffix_8 drafts from history" in sglang["1"]["disable_reason"]
    assert sglang["21"]["disable"] and "plain decoding had the best estimate" in sglang["21"]["disable_reason"]
    rows = json.loads((out / "bandit_winners.json").read_text())
    assert (rows[0]["strategy"], rows[-1]["strategy"]) == ("suffix_8", "disable")
    assert rows[0]["pulls"] == 4 and rows[-1]["pulls"] == 4, "each bucket holds the worker that observed it"
    assert "plain decoding: " in capsys.readouterr().out


def test_a_stopping_chain_is_exported_at_the_depth_it_reached_and_says_so(drafter_dir, tmp_path, capsys):
    """Neither engine stops a chain where the drafter is unsure: a stopping chain 12_1_13@0.3 that won a bucket by
    drafting ~4 levels is exported as the fixed chain of that depth (it was exported as 12 fixed levels, silently),
    with a note; a bucket it ran no round of takes the depth of the nearest batch size it ran, and says so."""
    config = BanditConfig(strategies=["12_1_13@0.3", "disable"], bs_thresholds=[1, 2, 5, 21], epsilon=0.0)
    bandit, chain = BanditSelector(config), Strategy.parse("12_1_13@0.3")
    for depth in (4, 5, 4, 3, 4, 4):
        bandit.observe(RoundStats(chain, 1, [depth], [depth - 1], [depth], 0.004))
        bandit.observe(RoundStats(DISABLE, 1, [0], [0], [1], 0.008))
    state = tmp_path / "bandit_state.json"
    state.write_text(json.dumps(bandit.state_dict()))
    out = tmp_path / "out"
    assert main(["export-drafter", str(drafter_dir), str(out), f"bandit_state={state}"]) == 0
    sglang = json.loads((out / "sglang_adaptive_config.json").read_text())
    assert (sglang["1"]["speculative_num_steps"], sglang["1"]["speculative_num_draft_tokens"]) == (4, 5)
    assert "12_1_13@0.3 stops drafting" in sglang["1"]["note"] and "4.00 levels on average" in sglang["1"]["note"]
    vllm = json.loads((out / "vllm_speculative_config.json").read_text())
    assert vllm["num_speculative_tokens"] == 4
    rows = json.loads((out / "bandit_winners.json").read_text())
    assert rows[0]["strategy"] == "12_1_13@0.3" and rows[0]["exported"] == "4_1_5"
    assert "batch size      1: 12_1_13@0.3 (exported as 4_1_5)" in capsys.readouterr().out
    unseen = [r for r in rows if r["strategy"] == "12_1_13@0.3" and r["pulls"] == 0]
    assert unseen and all(r["exported"] == "4_1_5" for r in unseen)
    assert all("no round of 12_1_13@0.3 in this bucket" in r["note"] and "at the nearest batch size" in r["note"]
               for r in unseen)  # fmt: skip


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_a_fused_drafter_is_refused_with_the_reason(tmp_path, capsys, fmt):
    """EAGLE-3's layout normalises embed and fused state separately and ends with a norm; fastrl's fused drafter
    does neither, so no exact export exists: one clear error, nothing written."""
    from fastrl.speculative.drafter_checkpoint import save_drafter
    from fastrl.speculative.fused_drafter import FusedEagleDrafter

    policy = load_model(bundled_model_dir())
    save_drafter(FusedEagleDrafter(policy.config, (0, 2)), tmp_path / "fused", "arith-tiny")
    shipped = str(bundled_drafter_dir())  # the shipped drafter reads the fused input too
    assert main(["export-drafter", shipped, str(tmp_path / "shipped"), "--format", fmt]) == 2
    assert "no exact translation exists" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"extra_layers \[0, 2\].*no exact translation exists"):
        export_eagle_drafter(tmp_path / "fused", tmp_path / "direct", fmt)
    assert not (tmp_path / "direct").exists()
    assert main(["export-drafter", str(tmp_path / "fused"), str(tmp_path / "out"), "--format", fmt]) == 2
    assert "hidden_norm" in capsys.readouterr().err and not (tmp_path / "out").exists()


def _damaged_copy(source: Path, target: Path, tensors=None, config=None) -> Path:
    """A copy of the drafter in ``source`` with its tensors and config changed by the given functions."""
    from fastrl.tensor_files import save_tensors

    target.mkdir()
    state = {k: v.clone() for k, v in load_file(str(source / "drafter.safetensors")).items()}
    save_tensors(tensors(state) if tensors else state, target / "drafter.safetensors")
    meta = json.loads((source / "drafter_config.json").read_text())
    (target / "drafter_config.json").write_text(json.dumps(config(meta) if config else meta))
    return target


def _with(mapping: dict, **changes) -> dict:
    return {**mapping, **changes}


@pytest.mark.parametrize(
    ("name", "tensors", "config", "message"),
    [
        (
            "inf",
            lambda s: _with(s, **{"fc.weight": s["fc.weight"].index_fill(0, torch.tensor([0]), torch.inf)}),
            None,
            "NaN or infinity",
        ),
        ("int", lambda s: _with(s, **{"fc.weight": s["fc.weight"].long()}), None, "floating"),
        ("shape", lambda s: _with(s, **{"fc.weight": s["fc.weight"][:, :100].contiguous()}), None, "mis-shaped"),
        ("missing", lambda s: {k: v for k, v in s.items() if k != "fc.bias"}, None, r"missing \['fc.bias'\]"),
        ("fuse", lambda s: _with(s, **{"fuse.weight": torch.zeros(192, 576)}), None, r"unexpected \['fuse.weight'\]"),
        (
            "layer",
            None,
            lambda m: _with(m, layer=_with(m["layer"], hidden_size=96, num_attention_heads=3, num_key_value_heads=1)),
            "layer has hidden size, vocabulary and layers",
        ),
        ("vocab", None, lambda m: _with(m, draft_vocab_size=10), "draft_vocab.safetensors is missing"),
    ],
)
def test_a_damaged_drafter_is_refused_before_anything_is_written(drafter_dir, tmp_path, name, tensors, config, message):
    """export-drafter checks a drafter as loading it for decoding does (tensors finite, floating point, every one
    there with its shape, config and weights agreeing): one error naming the file, no checkpoint written."""
    damaged = _damaged_copy(Path(drafter_dir), tmp_path / name, tensors, config)
    for fmt in ("sglang", "vllm"):
        with pytest.raises(ValueError, match=message):
            export_eagle_drafter(damaged, tmp_path / f"out_{fmt}", fmt, drop_fc_bias=fmt == "vllm")
        assert not (tmp_path / f"out_{fmt}").exists()


def test_a_tied_policys_drafter_exports_an_untied_sglang_config(tmp_path):
    """SmolLM2 ties its embeddings; SGLang's EAGLE model with ``tie_word_embeddings`` makes its LM head the embedding
    module, and the worker's ``set_embed_and_head`` deletes the embedding's weight and then the head's: the same
    parameter twice. Both come from the target, so the draft config says untied."""
    shipped = assets_dir() / "smollm2-drafter"
    assert json.loads((shipped / "drafter_config.json").read_text())["layer"]["tie_word_embeddings"] is True
    export_eagle_drafter(shipped, tmp_path, "sglang")
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False


def test_a_weight_that_overflows_float16_is_refused_naming_the_dtype(drafter_dir, tmp_path, capsys):
    """A finite drafter whose weight exceeds 65504 has no float16 export: one error naming the dtype and the tensor,
    nothing written (it was written with an infinite weight); float32 holds it."""
    big = _damaged_copy(
        Path(drafter_dir),
        tmp_path / "big",
        lambda s: _with(s, **{"fc.weight": s["fc.weight"].index_fill(0, torch.tensor([0]), 1e5)}),
    )
    with pytest.raises(ValueError, match=r"export_drafter.dtype=float16: .* as float16 in \['fc.weight'\]: .* 65504"):
        export_eagle_drafter(big, tmp_path / "direct", "sglang", dtype="float16")
    assert not (tmp_path / "direct").exists()
    assert main(["export-drafter", str(big), str(tmp_path / "out"), "dtype=float16"]) == 2
    assert "overflow past 65504, the largest float16 value" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    export_eagle_drafter(big, tmp_path / "f32", "sglang", dtype="float32")
    assert load_file(str(tmp_path / "f32" / "model.safetensors"))["fc.weight"][0, 0] == 1e5


def test_a_damaged_setting_in_the_bandit_state_is_one_error(drafter_dir, tmp_path, capsys):
    """A state whose setting's dtype is not a string (it crashed: TypeError, unhashable list) is refused as any
    damaged state is, naming the file and the entry; nothing written."""
    state = tmp_path / "bandit_state.json"
    state.write_text(json.dumps(_trained_bandit_state() | {"setting": {"drafter": "0" * 16, "dtype": ["bfloat16"]}}))
    assert main(["export-drafter", str(drafter_dir), str(tmp_path / "out"), f"bandit_state={state}"]) == 2
    err = capsys.readouterr().err
    assert f"bandit_state={state}: a damaged bandit state (setting.dtype must be a string, got ['bfloat16'])" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_an_overwrite_that_cannot_replace_a_file_leaves_the_earlier_output_as_it_was(drafter_dir, tmp_path, capsys):
    """overwrite=true into an output whose model.safetensors is a directory: one error naming it, and config.json is
    the earlier one still (it was replaced first, then an IsADirectoryError traceback)."""
    out = tmp_path / "out"
    (out / "model.safetensors").mkdir(parents=True)
    (out / "model.safetensors" / "f").write_text("x")
    (out / "config.json").write_text('{"old": 1}')
    assert main(["export-drafter", str(drafter_dir), str(out), "overwrite=true"]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'model.safetensors'} is a directory where this command writes a file" in err
    assert "Traceback" not in err and (out / "config.json").read_text() == '{"old": 1}'
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_state_of_the_full_vocabulary_drafter_is_refused_for_a_reduced_one(drafter_dir, narrow_drafter_dir, tmp_path):
    """The same weights over a 24-token draft vocabulary draft other tokens: a state learned with the full-vocabulary
    drafter does not fit them (it was taken: the fingerprint ignored the vocabulary)."""
    from fastrl.commands.bandit_state_file import drafter_fingerprint

    setting = {"drafter": drafter_fingerprint(drafter_dir, "float32"), "dtype": "float32", "policy": "0" * 16}
    state = tmp_path / "bandit_state.json"
    state.write_text(json.dumps(_trained_bandit_state() | {"setting": setting}))
    assert main(["export-drafter", str(drafter_dir), str(tmp_path / "full"), f"bandit_state={state}"]) == 0
    assert main(["export-drafter", str(narrow_drafter_dir), str(tmp_path / "narrow"), f"bandit_state={state}"]) == 2
    assert not (tmp_path / "narrow").exists()


def test_a_drafter_path_of_the_wrong_kind_is_named_for_what_it_is(drafter_dir, tmp_path, capsys):
    """A file given as the drafter directory said 'does not exist'; drafter.safetensors (or the config) being a
    directory said 'is missing'."""
    (tmp_path / "afile").write_text("x")
    assert main(["export-drafter", str(tmp_path / "afile"), str(tmp_path / "o1")]) == 2
    assert f"drafter directory {tmp_path / 'afile'} is a file: give the directory" in capsys.readouterr().err
    for name in ("drafter.safetensors", "drafter_config.json"):
        copy = tmp_path / name.split(".")[0]
        shutil.copytree(drafter_dir, copy)
        (copy / name).unlink()
        (copy / name).mkdir()
        with pytest.raises(ValueError, match=f"{name} is a directory, not a file"):
            export_eagle_drafter(copy, tmp_path / "o2", "sglang")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_a_path_holding_an_equals_sign_is_read_as_the_path(drafter_dir, tmp_path, capsys, monkeypatch):
    """A positional path with '=' (lr=0.1) was read as a setting: "has no key 'b6/lr'". A token whose key could be
    no key, or that names an existing path, is the path; a new one that reads as an unknown key says both readings;
    a key of export-drafter's stays a setting."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(drafter_dir, "runs/lr=0.1")
    shutil.copytree(drafter_dir, "lr=0.2")
    assert main(["export-drafter", "runs/lr=0.1", "out/lr=0.1", "dtype=float32"]) == 0
    assert json.loads((tmp_path / "out" / "lr=0.1" / "config.json").read_text())["torch_dtype"] == "float32"
    assert main(["export-drafter", "lr=0.2", "./o=1"]) == 0 and (tmp_path / "o=1" / "model.safetensors").is_file()
    capsys.readouterr()
    assert main(["export-drafter", "lr=0.2", "o=2"]) == 2
    err = capsys.readouterr().err
    assert "'o=2' is neither a setting (export-drafter has no key 'o'; its keys are [" in err
    assert "nor an existing path; give a new output directory whose name holds '=' as ./o=2" in err
    assert main(["export-drafter", "lr=0.2", "out/x", "dtyp=float16"]) == 2
    assert "no key 'dtyp'; did you mean 'dtype'?" in capsys.readouterr().err
    assert not (tmp_path / "o=2").exists() and not (tmp_path / "out" / "x").exists()


@pytest.mark.parametrize("key", ["drop_fc_bias", "full_vocab"])
def test_vllm_only_options_are_refused_for_sglang(narrow_drafter_dir, tmp_path, capsys, key):
    """drop_fc_bias and full_vocab are vLLM's; with --format sglang they were silently ignored (the bias and the
    token map kept): one error naming the key and the format, nothing written."""
    with pytest.raises(ValueError, match=f"export_drafter.{key}=true applies to --format vllm only"):
        export_eagle_drafter(narrow_drafter_dir, tmp_path / "direct", "sglang", **{key: True})
    assert main(["export-drafter", str(narrow_drafter_dir), str(tmp_path / "out"), f"{key}=true"]) == 2
    assert f"export_drafter.{key}=true applies to --format vllm only" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_plain_decoding_at_batch_size_1_is_noted_in_the_vllm_config(drafter_dir, tmp_path, capsys, monkeypatch):
    """vLLM needs num_speculative_tokens >= 1: a bucket-1 winner of plain decoding was exported as 1, silently. The
    config keeps 1 (valid) with a note, and the export warns; ``model`` is the export's absolute path, not the output
    as typed (vLLM resolves it from its own working directory)."""
    bandit = BanditSelector(BanditConfig(strategies=["3_1_4", "disable"], bs_thresholds=[1, 2, 5, 21], epsilon=0.0))
    for _ in range(6):
        bandit.observe(RoundStats(Strategy.parse("3_1_4"), 1, [3], [0], [1], 0.020))
        bandit.observe(RoundStats(DISABLE, 1, [0], [0], [1], 0.008))
    (tmp_path / "bandit_state.json").write_text(json.dumps(bandit.state_dict()))
    monkeypatch.chdir(tmp_path)
    assert main(["export-drafter", str(drafter_dir), "out", "bandit_state=bandit_state.json"]) == 0
    vllm = json.loads((tmp_path / "out" / "vllm_speculative_config.json").read_text())
    assert vllm["num_speculative_tokens_per_batch_size"]["1"] == 0 and vllm["num_speculative_tokens"] == 1
    assert "batch size 1's learned choice is plain decoding" in vllm["note"]
    assert "without --speculative-config" in vllm["note"]
    assert vllm["model"] == str((tmp_path / "out").resolve())
    err = capsys.readouterr().err
    assert "warning: out/vllm_speculative_config.json: batch size 1's learned choice is plain decoding" in err


def test_a_batch_size_1_that_drafts_has_no_note(drafter_dir, tmp_path):
    state = tmp_path / "bandit_state.json"
    state.write_text(json.dumps(_trained_bandit_state()))
    write_selection_configs(state, tmp_path / "out", "draft")
    assert "note" not in json.loads((tmp_path / "out" / "vllm_speculative_config.json").read_text())
