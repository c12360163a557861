"""Structured config of `fastrl generate`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING

from fastrl.commands.decode_config import DecodeConfig


@dataclass
class GenerateConfig(DecodeConfig):
    """Keys of `fastrl generate` (see conf/generate.yaml): the decode keys, plus where results go."""

    output: str = MISSING  # required (`???` in --help); a dataclass default: it follows defaulted keys
    stats_output: str = ""
    plot_output: str = ""
    bandit_state: str = ""
    resume: bool = True

    def __post_init__(self) -> None:
        self.check_decode_keys("generate")
        if not self.output or self.output == MISSING:
            raise ValueError("generate.output: give an output JSONL file, e.g. output=out.jsonl")
        if self.bandit_state and self.strategy != "bandit":
            raise ValueError(f"generate.bandit_state: a bandit's state file needs strategy=bandit, got {self.strategy}")
        if self.plot_output:  # the format goes by the suffix: checked before the run, not when the plot is drawn
            from matplotlib.backend_bases import FigureCanvasBase

            formats = sorted(FigureCanvasBase.get_supported_filetypes())
            suffix = Path(self.plot_output).suffix.lstrip(".").lower()
            if suffix not in formats:
                raise ValueError(f"generate.plot_output={self.plot_output}: give a file ending in one of {formats}")
            if suffix == "pgf":  # matplotlib draws it through LaTeX, after the whole run
                import shutil

                import matplotlib

                tex = matplotlib.rcParams["pgf.texsystem"]
                if shutil.which(tex) is None:
                    raise ValueError(
                        f"generate.plot_output={self.plot_output}: a .pgf plot is drawn with {tex}, which is not "
                        "installed; give another format (.png, .pdf, .svg)"
                    )
