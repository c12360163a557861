"""Structured config of `fastrl export-drafter`."""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.integrations.export.eagle_checkpoint import check_options


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
        check_options(self.format, self.dtype, self.drop_fc_bias, self.full_vocab)
