"""Load and save HF-format checkpoints (config.json + safetensors, single-file or sharded); never pickle."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import mmap
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from fastrl.json_values import read_json
from fastrl.models.config import ModelConfig, token_ids
from fastrl.models.decoder import CausalLM
from fastrl.tensor_files import save_tensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
GENERATION_CONFIG_FILE = "generation_config.json"
INDEX_FILE = "model.safetensors.index.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
DIGEST_PREFIX = "sha256:"  # weights_fingerprint's values (weights_heads_fingerprint's have none)


def read_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of an HF checkpoint directory: its config.json, with the EOS ids of its generation_config.json
    in place of config.json's where that file has some (see `_generation_eos`)."""
    directory = Path(path)
    file = directory / CONFIG_FILE
    if not present_file(file, directory):
        raise ValueError(f"checkpoint directory {directory} has no {CONFIG_FILE}")
    d = read_json(file)
    if not isinstance(d, dict):
        raise ValueError(f"{file} must hold a JSON object")
    if d.get("quantization_config"):
        method = d["quantization_config"]
        method = method.get("quant_method", "?") if isinstance(method, dict) else method
        raise ValueError(f"{file}: quantized checkpoints are not supported (quantization_config: {method!r})")
    try:
        config = ModelConfig.from_hf_dict(d)
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None
    eos = _generation_eos(directory)
    if eos is not None:
        config.eos_token_id = eos
    return config


def _generation_eos(directory: Path) -> int | list[int] | None:
    """The EOS ids of the checkpoint's generation_config.json, which replace config.json's as in transformers'
    ``generate`` (chat models keep their end-of-turn id there only: Llama-3-Instruct's <|eot_id|>). None, so that
    config.json's stay, when the file is absent or its ``eos_token_id`` is absent, null or []: there ``generate``
    stops on no token at all, but a rollout engine stops on the model's EOS, as vLLM and SGLang do. ValueError
    naming the file when it is there but not a file (``present_file``), not JSON, not a JSON object, or the ids are
    not ids."""
    file = directory / GENERATION_CONFIG_FILE
    if not present_file(file, directory):
        return None
    d = read_json(file)
    if not isinstance(d, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(d).__name__}")
    try:
        eos = token_ids(d, "eos_token_id")
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None
    return None if eos == [] else eos


def weight_files(directory: Path) -> dict[Path, list[str] | None]:
    """Safetensors files to read -> the tensor names to take from each (None: all of them): ``model.safetensors``
    when the directory has one, else the shards of its index, in transformers' order (a directory holding both
    loads the same weights in either). A shard index that is not valid JSON, has no ``weight_map`` or names a shard
    outside ``directory`` is a ValueError naming the index; either file there but not a file (a dangling symlink of
    a half-downloaded hub snapshot, a directory), or such a shard, is one naming it and what it is."""
    if present_file(directory / WEIGHTS_FILE, directory):
        return {directory / WEIGHTS_FILE: None}
    index = directory / INDEX_FILE
    if present_file(index, directory):
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
            raise ValueError(f"{index} is not a valid shard index: {err}") from None
        if not weight_map:
            raise ValueError(f"{index} has no weight_map (tensor names -> shard files): not a shard index")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index}: weight_map must map tensor names to shard file names")
        shards: dict[Path, list[str]] = {}
        for name, shard in weight_map.items():
            if not _names_a_file_inside(shard):
                raise ValueError(f"{index} names shard {shard!r} outside the checkpoint directory {directory}")
            shards.setdefault(directory / shard, []).append(name)
        check_shard_files(index, list(shards))
        return dict(shards.items())
    raise ValueError(f"checkpoint directory {directory} has no {WEIGHTS_FILE} or {INDEX_FILE} (only safetensors load)")


def check_shard_files(index: Path, shards: list[Path]) -> None:
    """ValueError naming ``index`` and the shards it names that are missing from its directory, or there but no
    regular file (``file_problem``: a dangling symlink, a directory)."""
    problems = {f.name: file_problem(f) for f in shards}
    missing = sorted(name for name, problem in problems.items() if problem == MISSING)
    if missing:
        raise ValueError(f"{index} names shards missing from {index.parent}: {missing}")
    broken = sorted(f"{name} {problem}" for name, problem in problems.items() if problem)
    if broken:
        raise ValueError(f"{index} names shards that are not files in {index.parent}: {broken}")


MISSING = "is missing"
"""``file_problem``'s answer for a path with nothing at it."""


def file_problem(file: Path) -> str | None:
    """What keeps ``file`` from being read as a file (``is missing``, ``is a directory, not a file``, ``is a dangling
    symlink (to T)``, ...), None when nothing does: the end of an error message naming it."""
    if file.is_file():
        return None
    if file.is_dir():
        return "is a directory, not a file"
    if file.is_symlink() and not file.exists():
        return f"is a dangling symlink (to {os.readlink(file)})"
    return MISSING if not file.exists() else "is not a regular file"


def present_file(file: Path, directory: Path) -> bool:
    """Whether ``file`` (of the checkpoint ``directory``) is there as a regular file; False when nothing is at its
    path. ValueError naming the directory, the file and what it is when something else is (``file_problem``: a
    dangling symlink, e.g. a half-downloaded hub snapshot's, or a directory), rather than reading as absent."""
    problem = file_problem(file)
    if problem == MISSING:
        return False
    if problem:
        raise ValueError(f"checkpoint directory {directory}: {file.name} {problem}")
    return True


def _names_a_file_inside(shard: str) -> bool:
    """Whether a shard index's file name stays inside its directory, read as written: a Hugging Face hub snapshot's
    shards are links into the cache's blobs, which resolving them would place outside."""
    norm = os.path.normpath(shard)
    return not os.path.isabs(shard) and norm not in (os.curdir, os.pardir) and not norm.startswith(os.pardir + os.sep)


def config_fingerprint(directory: Path) -> str:
    """``sha256:`` and the hex sha256 of the model's configuration as fastrl reads it (``read_config``: config.json
    with generation_config.json's EOS ids), so a changed RoPE base, norm epsilon or stop id tells two checkpoints
    apart where their weights are the same."""
    config = dataclasses.asdict(read_config(directory))
    return f"{DIGEST_PREFIX}{hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()}"


def weights_fingerprint(directory: Path) -> str:
    """``sha256:`` and the hex sha256 of every tensor of a checkpoint, in name order: its name, dtype, shape and
    stored bytes, read from its safetensors files (mapped, not loaded). Tells two checkpoints apart whatever path
    names them and whatever part of which tensor differs (a model with a few new token rows from its base); one pass
    over the weights, ~2 GB/s. ValueError naming the file when one cannot be read."""
    digest = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        entries = []
        for file, names in weight_files(directory).items():
            data, header = stack.enter_context(_mapped_safetensors(file))
            for name in names if names is not None else [n for n in header if n != "__metadata__"]:
                if name not in header:
                    raise ValueError(f"{file} has no tensor {name!r} (its shard index names it there)")
                entries.append((name, data, header[name], file))
        for name, data, info, file in sorted(entries, key=lambda e: e[0]):
            try:
                begin, end = (int(x) for x in info["data_offsets"])
                digest.update(f"{name}:{info['dtype']}:{tuple(info['shape'])}:".encode())
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{file} is not a readable safetensors file (tensor {name!r}: {err})") from None
            if not 0 <= begin <= end <= len(data):
                raise ValueError(f"{file} is not a readable safetensors file (tensor {name!r} past the file's end)")
            digest.update(data[begin:end])
    return f"{DIGEST_PREFIX}{digest.hexdigest()}"


@contextlib.contextmanager
def _mapped_safetensors(file: Path) -> Iterator[tuple[memoryview, dict]]:
    """A safetensors file's data section (a read-only memory map, past its header) and its parsed header; ValueError
    naming the file when it cannot be read as one."""
    unreadable = f"{file} is not a readable safetensors file"
    try:
        with open(file, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as err:  # ValueError: an empty file
        raise ValueError(f"{unreadable} ({err})") from None
    with mapped, memoryview(mapped) as view:
        size = int.from_bytes(view[:8], "little")
        try:
            header = json.loads(bytes(view[8 : 8 + size])) if len(view) >= 8 + size else None
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{unreadable} (its header: {err})") from None
        if not isinstance(header, dict):
            raise ValueError(f"{unreadable} (its header is cut short or not a JSON object)")
        with view[8 + size :] as data:
            yield data, header


def weights_heads_fingerprint(directory: Path) -> str:
    """The fingerprint ``generate`` kept before ``weights_fingerprint`` (results written then carry it): a short
    hash of each tensor's name, shape and the first values of its first row, which most changes of weights move but
    not all. Compared only with such records."""
    heads = []
    for file, names in sorted(weight_files(directory).items()):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in sorted(names if names is not None else f.keys()):
                    part = f.get_slice(name)
                    shape = tuple(part.get_shape())
                    head = (part[0:1] if shape else f.get_tensor(name)).flatten()[:16]
                    heads.append((name, shape, head.to(torch.float64)))
        except (OSError, SafetensorError) as err:
            raise ValueError(f"{file} is not a readable safetensors file ({err})") from None
    return heads_digest(heads)


def heads_digest(heads: Iterable[tuple[str, tuple[int, ...], Tensor]]) -> str:
    """The one recipe of fastrl's weight fingerprints: a short sha256 of each tensor's name, shape and head values
    (``(name, shape, head)`` in the order given; the head's dtype is the caller's choice, and part of the hash)."""
    digest = hashlib.sha256()
    for name, shape, head in heads:
        digest.update(f"{name}:{shape}:".encode() + head.numpy().tobytes())
    return digest.hexdigest()[:16]


def read_safetensors(file: Path, names: list[str] | None = None) -> dict[str, Tensor]:
    """The tensors ``names`` (None: all) of one safetensors file on the CPU, as stored. A truncated or corrupt file,
    or a name it lacks, is a ValueError naming the file."""
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            keys = set(f.keys())
            absent = sorted(set(names or []) - keys)
            if absent:
                raise ValueError(f"{file} lacks tensors its index names: {absent[:5]}")
            return {name: f.get_tensor(name) for name in (names if names is not None else sorted(keys))}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{file} is not a readable safetensors file (truncated or corrupt?): {err}") from None


def non_finite_names(tensors: dict[str, Tensor]) -> list[str]:
    """The names of the tensors that hold NaN or infinity, sorted."""
    return sorted(n for n, t in tensors.items() if not bool(torch.isfinite(t).all()))


def check_weights(tensors: dict[str, Tensor], where: Path | str) -> None:
    """ValueError naming ``where`` and the tensors when any is not floating point (integer or bool weights give
    garbage once cast), is a float8 tensor (a quantized checkpoint: its scales live in other tensors, so a cast
    alone is not the model) or holds NaN or infinity."""
    not_float = sorted(f"{n} ({t.dtype})" for n, t in tensors.items() if not t.is_floating_point())
    if not_float:
        raise ValueError(f"{where}: weights must be floating point, found {not_float[:5]}")
    float8 = sorted(f"{n} ({t.dtype})" for n, t in tensors.items() if t.element_size() == 1)
    if float8:
        raise ValueError(f"{where}: float8 (quantized) weights are not supported, found {float8[:5]}")
    not_finite = non_finite_names(tensors)
    if not_finite:
        raise ValueError(f"{where}: weights hold NaN or infinity in {not_finite[:5]}")


def read_tensors(directory: Path, dtype: torch.dtype, device: torch.device | str) -> dict[str, Tensor]:
    """Every tensor of the checkpoint, checked (floating point, finite), cast to dtype on device, HF rotary
    buffers dropped."""
    tensors: dict[str, Tensor] = {}
    for file, names in weight_files(directory).items():
        stored = {k: v for k, v in read_safetensors(file, names).items() if not k.endswith(IGNORED_SUFFIXES)}
        check_weights(stored, file)
        tensors.update({k: v.to(device=device, dtype=dtype) for k, v in stored.items()})
    bad = non_finite_names(tensors)
    if bad:
        raise ValueError(f"checkpoint {directory}: weights overflow to infinity in {dtype}: {bad[:5]}")
    return tensors


def check_tensors(model: nn.Module, tensors: dict[str, Tensor], where: str = "checkpoint") -> None:
    """Raises one ValueError listing missing, unexpected and mis-shaped tensors, naming ``where`` they come from
    (``checkpoint DIR``, ``pushed policy weights``)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = sorted(
        f"{name}: checkpoint {tuple(t.shape)} vs model {expected[name]}"
        for name, t in tensors.items()
        if name in expected and tuple(t.shape) != expected[name]
    )
    problems = [f"missing tensors {missing}"] if missing else []
    problems += [f"unexpected tensors {unexpected}"] if unexpected else []
    problems += [f"mis-shaped tensors {shapes}"] if shapes else []
    if problems:
        raise ValueError(f"{where} does not match the config: " + "; ".join(problems))


def check_cast(model: nn.Module, tensors: dict[str, Tensor], where: str) -> None:
    """ValueError naming ``where`` and the tensors that overflow to infinity once cast to the dtype of the
    ``model``'s tensor of their name (a finite float32 1e5 is infinite in float16): the check a checkpoint gets at
    load (`read_tensors`), for weights pushed into a live model."""
    live = model.state_dict()
    bad = [  # one tensor cast at a time: a whole cast copy of a large policy would double its host memory
        k
        for k, v in tensors.items()
        if k in live and v.dtype != live[k].dtype and not v.to(live[k].dtype).isfinite().all()
    ]
    if bad:
        raise ValueError(f"{where}: weights overflow to infinity in {live[bad[0]].dtype}: {bad[:5]}")


def drop_tied_copy(tensors: dict[str, Tensor], where: str) -> None:
    """Remove the LM head that weights of a tied model may hold beside the embeddings (some checkpoints store it, a
    trainer's state_dict has it); ValueError naming the key and ``where`` the weights come from when it is not the
    embeddings' copy (the config says tied, the weights say otherwise: tying would drop a trained head)."""
    head, embed = tensors.pop("lm_head.weight", None), tensors.get("model.embed_tokens.weight")
    if head is not None and embed is not None and not torch.equal(head, embed):
        raise ValueError(
            f"{where}: the model's config says tie_word_embeddings=true, but the weights hold an lm_head.weight "
            "that is not model.embed_tokens.weight; set tie_word_embeddings to false if the model has its own LM "
            "head"
        )


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> CausalLM:
    """Builds a CausalLM from a local HF directory (stored weights cast to dtype), in eval mode."""
    directory = Path(path)
    if not directory.is_dir():
        what = "is a file, not a directory" if directory.exists() else "does not exist"
        raise ValueError(f"checkpoint directory {directory} {what} (give the model's directory)")
    config = read_config(directory)
    tensors = read_tensors(directory, dtype, device)
    if config.tie_word_embeddings:
        drop_tied_copy(tensors, f"checkpoint {directory}")
    with torch.device("meta"):
        model = CausalLM(config)
    check_tensors(model, tensors, f"checkpoint {directory}")
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    return model.eval()


def save_model(model: CausalLM, path: str | Path, dtype: torch.dtype | None = None) -> None:
    """Writes config.json + model.safetensors (tied: no lm_head.weight) loadable by `load_model` and by
    transformers' AutoModelForCausalLM (both read model.safetensors before a shard index an earlier checkpoint left
    in the directory). `dtype` None keeps the model's dtype."""
    directory = Path(path)
    dtype = dtype or model.model.embed_tokens.weight.dtype
    config = model.config.to_hf_dict(dtype=dtype)  # refuses what it cannot write before anything is created
    directory.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    tensors = {name: t.detach().to(device="cpu", dtype=dtype).contiguous() for name, t in state.items()}
    save_tensors(tensors, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
