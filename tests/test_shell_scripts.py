"""Every shell script of the repository parses (`bash -n`): one that does not cannot run at all, and the GPU-only
ones never run in CI (recipes/verl_grpo/run_gpu.sh did not parse: an apostrophe inside ${VAR:?message})."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted({*ROOT.glob("recipes/**/*.sh"), ROOT / ".ci" / "run"})


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(ROOT)) for s in SCRIPTS])
def test_the_script_parses(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
