"""Copy a trained drafter into the package assets with its weights in bfloat16 (half the size; `load_drafter`
casts them to the policy's dtype).

    python recipes/smollm2_drafter/ship.py DRAFTER_DIR fastrl/assets/smollm2-drafter --overwrite

The source is read and checked whole (config, weights, draft vocabulary, metrics) before anything is written; the
target is written through a staged directory renamed into place, so a refused or failed run leaves it as it was.
A target holding files is refused unless ``--overwrite`` (then the drafter's files there are replaced, and a draft
vocabulary or metrics.json the new drafter lacks is removed: the target never mixes two drafters).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from fastrl.bench.cli_args import existing_dir
from fastrl.commands.output_guard import check_output_dir
from fastrl.commands.staged_output import staged_directory
from fastrl.speculative.drafter_checkpoint import (
    CONFIG_FILE,
    DRAFT_VOCAB_FILE,
    METRICS_FILE,
    WEIGHTS_FILE,
    read_checked_drafter,
)
from fastrl.tensor_files import save_tensors

DRAFTER_FILES = (CONFIG_FILE, METRICS_FILE, DRAFT_VOCAB_FILE, WEIGHTS_FILE)


def ship(source: Path, target: Path, overwrite: bool = False) -> None:
    """Write drafter_config.json, metrics.json and the draft vocabulary (when the drafter has them) and a bfloat16
    drafter.safetensors from `source` to `target`. ValueError naming what is wrong, and nothing written, when the
    source is not a whole drafter or the target cannot take it."""
    info, tensors, _vocab = read_checked_drafter(source)
    output = check_output_dir("target", str(target), {"source": str(source)}, overwrite=overwrite)
    with staged_directory(output, owned=DRAFTER_FILES) as staging:
        shutil.copyfile(source / CONFIG_FILE, staging / CONFIG_FILE)
        if (source / METRICS_FILE).is_file():
            shutil.copyfile(source / METRICS_FILE, staging / METRICS_FILE)
        if info.draft_vocab_size is not None:
            shutil.copyfile(source / DRAFT_VOCAB_FILE, staging / DRAFT_VOCAB_FILE)
        save_tensors(
            {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, staging / WEIGHTS_FILE, {"format": "pt"}
        )
    size = (target / WEIGHTS_FILE).stat().st_size
    print(f"drafter shipped to {target} ({size / 2**20:.1f} MiB of bfloat16 weights)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python recipes/smollm2_drafter/ship.py",
        description="Copy a trained drafter into a directory (the package assets) with bfloat16 weights.",
    )
    parser.add_argument("source", type=existing_dir, help="the trained drafter directory")
    parser.add_argument("target", help="where to ship it (e.g. fastrl/assets/smollm2-drafter)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the drafter in a target that holds files (the shipped one)"
    )
    args = parser.parse_args(argv)
    try:
        ship(args.source, Path(args.target), overwrite=args.overwrite)
    except ValueError as err:
        parser.error(str(err).replace("pass overwrite=true", "pass --overwrite"))


if __name__ == "__main__":
    main()
