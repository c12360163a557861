"""A fastrl drafter as the EAGLE(-2) draft checkpoint SGLang and vLLM load.

The layout matched (third_party/README.md cites the loaders):

* SGLang ``python/sglang/srt/models/llama_eagle.py`` (and ``qwen2_eagle.py``): ``architectures`` is
  ``LlamaForCausalLMEagle`` / ``Qwen2ForCausalLMEagle``; the draft model is ``fc`` (Linear 2H -> H, with bias)
  over ``cat(embed(token), feature)`` and ``num_hidden_layers`` decoder layers whose layer 0 has no
  ``input_layernorm``, then no final norm; checkpoint names carry no ``model.`` prefix (the loader adds it).
  Embedding and LM head are the target's (the EAGLE worker shares them), so the checkpoint omits them, and its
  config says ``tie_word_embeddings: false`` whatever the target's: tied, the draft model's LM head *is* its
  embedding module, and the worker's ``set_embed_and_head`` (``del`` embed weight, ``del`` head weight) would
  delete that one parameter twice.
* vLLM ``vllm/model_executor/models/llama_eagle.py``: the same names, but the draft config names the *target*
  architecture (``LlamaForCausalLM``; vLLM's ``EAGLEConfig`` prefixes ``Eagle``), only Llama has an EAGLE-1
  model there, and its ``fc`` has no bias: a drafter with a non-zero ``fc.bias`` cannot be served exactly.

A drafter with a reduced draft vocabulary (``draft_vocab_size``: its LM head is the policy's rows of those
tokens) keeps it in SGLang's form: ``--speculative-token-map FILE`` (FR-Spec) takes a file of the "hot" token ids,
read with ``torch.load(weights_only=True)``, restricts the shared LM head to those rows and maps the draft's index
``i`` back to token ``ids[i]``, which is fastrl's draft head (``TOKEN_MAP_FILE``, in the drafter's order). vLLM's
EAGLE(-1) drafter has no such map: it drafts over the whole vocabulary, a function other than fastrl's, so that
export needs ``full_vocab=True``.

A fused drafter (``extra_layers``, EAGLE-3's input) is refused: see ``FUSED_REFUSAL``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from fastrl.speculative.drafter_checkpoint import CONFIG_FILE, SAVE_DTYPES, cast_weights, read_checked_drafter
from fastrl.tensor_files import save_tensors

FORMATS = ("sglang", "vllm")
DTYPES = SAVE_DTYPES  # the dtypes a drafter checkpoint is written in
SGLANG_ARCHITECTURES = {"llama": "LlamaForCausalLMEagle", "qwen2": "Qwen2ForCausalLMEagle"}
VLLM_ARCHITECTURES = {"llama": "LlamaForCausalLM"}
OUTPUT_WEIGHTS = "model.safetensors"
TOKEN_MAP_FILE = "hot_token_ids.pt"  # SGLang's --speculative-token-map: the draft vocabulary's token ids, in order
# Why a fused drafter has no exact EAGLE-3 export (read from SGLang's python/sglang/srt/models/llama_eagle3.py and
# vLLM's vllm/model_executor/models/llama_eagle3.py).
FUSED_REFUSAL = (
    "export-drafter cannot write a fused drafter (extra_layers {layers}) in the EAGLE-3 layout that SGLang and vLLM "
    "load (LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM): no exact translation exists. Their draft computes "
    "h = fc(aux states, 3H -> H, no bias in vLLM), then attention over cat(input_layernorm(embed), "
    "hidden_norm(h)) (2H -> q/k/v) with h as the residual, and a final norm before the LM head; fastrl's drafter "
    "mixes embed and fused feature through fc(cat(embed, fuse(features))) (with bias) before an attention over H "
    "with no input norm, and its output feeds the LM head without a norm. The per-token RMS norms cannot be "
    "folded into linear weights, and the aux states those engines capture are residual-stream layer inputs "
    "(eagle_aux_hidden_state_layer_ids), never the final-norm state fastrl's fused input ends with. Serving a "
    "fused drafter there needs a drafter trained in the EAGLE-3 architecture itself; a last-layer drafter "
    "exports as EAGLE(-1/2)."
)


@dataclass(frozen=True)
class ExportedDrafter:
    """What was written: the directory, the engine format, the architecture named, the tensors and their dtype."""

    path: Path
    format: str
    architecture: str
    tensor_names: list[str]
    dtype: str
    token_map: Path | None = None  # SGLang's --speculative-token-map file, for a drafter with a draft vocabulary
    draft_vocab_size: int | None = None  # its size; None: the export drafts over the whole vocabulary


def eagle_tensor_names(state: dict[str, Tensor]) -> dict[str, str]:
    """fastrl drafter names -> EAGLE checkpoint names (``layer.X`` -> ``layers.0.X``; ``fc.*`` unchanged)."""
    names = {}
    for name in state:
        if name.startswith("layer."):
            names[name] = "layers.0." + name[len("layer.") :]
        elif name.startswith("fc."):
            names[name] = name
        else:
            raise ValueError(f"drafter tensor {name!r} has no EAGLE checkpoint name")
    return names


def check_options(fmt: str, dtype: str, drop_fc_bias: bool = False, full_vocab: bool = False) -> None:
    """ValueError naming the key when the format or dtype is unsupported, or when ``drop_fc_bias`` or ``full_vocab``
    is set for SGLang: both are vLLM's (its EAGLE ``fc`` has no bias and it has no token map); SGLang keeps the bias
    and the draft vocabulary, so setting them there would silently do nothing."""
    if fmt not in FORMATS:
        raise ValueError(f"export_drafter.format must be one of {list(FORMATS)}, got {fmt!r}")
    if dtype not in DTYPES:
        raise ValueError(f"export_drafter.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if fmt == "sglang":
        for key, value, why in (
            ("drop_fc_bias", drop_fc_bias, "SGLang's EAGLE fc has a bias, so the drafter's is kept"),
            ("full_vocab", full_vocab, "SGLang keeps a draft vocabulary as its token map"),
        ):
            if value:
                raise ValueError(f"export_drafter.{key}=true applies to --format vllm only: {why}; remove it")


def export_eagle_drafter(
    drafter_dir: str | Path,
    output: str | Path,
    fmt: str,
    dtype: str = "bfloat16",
    drop_fc_bias: bool = False,
    full_vocab: bool = False,
) -> ExportedDrafter:
    """Write ``drafter_dir`` (a fastrl drafter checkpoint) to ``output`` as an EAGLE checkpoint for ``fmt``, with
    SGLang's token map (``TOKEN_MAP_FILE``) when the drafter has a draft vocabulary.

    ValueError naming the key when the options do not fit (``check_options``) or the model family is unsupported,
    or (vLLM) when ``fc.bias``
    is non-zero and ``drop_fc_bias`` is not set, or when the drafter has a draft vocabulary and ``full_vocab`` is
    not set, or when a weight overflows to infinity as ``dtype`` (``cast_weights``); for a fused drafter,
    ``FUSED_REFUSAL`` (nothing is written).
    """
    check_options(fmt, dtype, drop_fc_bias, full_vocab)
    info, state, draft_vocab = read_checked_drafter(drafter_dir)
    if info.extra_layers:
        raise ValueError(FUSED_REFUSAL.format(layers=list(info.extra_layers)))
    size = None if draft_vocab is None else int(draft_vocab.numel())
    map_name = TOKEN_MAP_FILE if fmt == "sglang" and draft_vocab is not None else None  # SGLang keeps the vocabulary
    drafted = size if map_name else None  # the vocabulary the export drafts over: vLLM's is the whole one
    if fmt == "vllm" and draft_vocab is not None and not full_vocab:
        raise ValueError(
            f"export_drafter.full_vocab: this drafter drafts over a {size}-token draft vocabulary "
            "and vLLM's EAGLE drafter has no token map (it drafts over the whole vocabulary); set full_vocab=true "
            "to export it anyway (drafts then differ from fastrl's), or export --format sglang, which keeps the map"
        )
    layer = info.layer_config.to_hf_dict()
    model_type = str(layer.get("model_type"))
    table = SGLANG_ARCHITECTURES if fmt == "sglang" else VLLM_ARCHITECTURES
    if model_type not in table:
        supported = sorted(table)
        raise ValueError(
            f"export_drafter.format={fmt}: no EAGLE draft architecture for model_type {model_type!r} ({supported=})"
        )
    if fmt == "vllm" and "fc.bias" in state:
        if bool(state["fc.bias"].abs().max() > 0) and not drop_fc_bias:
            raise ValueError(
                "export_drafter.drop_fc_bias: vLLM's EAGLE fc has no bias and this drafter's fc.bias is non-zero; "
                "set drop_fc_bias=true to export without it (drafts then differ from fastrl's)"
            )
        state.pop("fc.bias")
    names = eagle_tensor_names(state)
    cast = cast_weights(state, dtype, f"export_drafter.dtype={dtype}: the drafter {drafter_dir}")
    tensors = {names[k]: v for k, v in cast.items()}
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, out / OUTPUT_WEIGHTS, metadata={"format": "pt"})
    config = dict(layer)
    config.update(
        architectures=[table[model_type]],
        num_hidden_layers=1,
        **({"tie_word_embeddings": False} if fmt == "sglang" else {}),
        torch_dtype=dtype,
        dtype=dtype,
        fastrl={
            "policy": info.policy_name,
            "drafter_version": info.version,
            "format": fmt,
            "draft_vocab_size": drafted,
            "token_map": map_name,
        },
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    token_map = None if map_name is None else out / map_name
    if token_map is not None:  # a plain int64 tensor: SGLang reads it with weights_only=True
        torch.save(draft_vocab.to(torch.int64).contiguous(), token_map)
    return ExportedDrafter(out, fmt, table[model_type], sorted(tensors), dtype, token_map, drafted)


def is_fastrl_drafter(path: str | Path) -> bool:
    """True when ``path`` holds a fastrl drafter checkpoint."""
    return (Path(path) / CONFIG_FILE).is_file()
