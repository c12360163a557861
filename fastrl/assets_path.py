"""Where the bundled model and drafter live inside the installed package."""

from __future__ import annotations

from pathlib import Path

BUNDLED_MODEL_NAME = "arith-tiny"
BUNDLED_DRAFTER_NAME = "arith-tiny-drafter"


def assets_dir() -> Path:
    """The package's asset directory."""
    return Path(__file__).resolve().parent / "assets"


def bundled_model_dir() -> Path:
    """The small task model this repo trains and ships (recipes/bundled_model)."""
    return assets_dir() / BUNDLED_MODEL_NAME


def bundled_drafter_dir() -> Path:
    """The EAGLE drafter trained for the bundled model (`fastrl train-drafter`, recipes/bundled_model)."""
    return assets_dir() / BUNDLED_DRAFTER_NAME
