"""Structured config of `fastrl export-drafter`."""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.integrations.export.eagle_checkpoint import DTYPES, FORMATS


@dataclass
class ExportDrafterConfig:
    """Keys of `fastrl export-drafter` (see conf/export_drafter.yaml)."""

    drafter: str = ""
    output: str = ""
    format: str = "sglang"
    dtype: str = "bfloat16"
    drop_fc_bias: bool = False
    full_vocab: bool = False
    bandit_state: str = ""
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not self.drafter:
            raise ValueError("export_drafter.drafter: give a fastrl drafter directory (first positional argument)")
        if not self.output:
            raise ValueError("export_drafter.output: give an output directory (second positional argument)")
        if self.format not in FORMATS:
            raise ValueError(f"export_drafter.format must be one of {list(FORMATS)}, got {self.format!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"export_drafter.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
