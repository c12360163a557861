"""The README's two set-up commands are exactly what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", setup, flags=re.S)]


def test_readme_has_exactly_two_setup_commands():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in c for c in commands)


def test_ci_runs_the_readme_commands():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in _readme_commands():
        assert command in ci, f"README command not run by .ci/run: {command}"
