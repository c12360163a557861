"""The ``results.json`` of the GPU recipes (``recipes/gpu_model/run.py``, ``engine_check.py``): filled phase by phase,
over several calls on one machine, each phase's result written whole as it ends. The file says which machine and
settings made it (``identity``: device, torch, smoke size); a later call adds its phases only where those match, so
one file never holds figures of two machines, and a damaged file is one error before any work."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fastrl.atomic_files import write_atomic
from fastrl.json_values import read_json


@dataclass
class ResultsFile:
    """``results``: what the file holds (its identity keys included); ``record`` adds one phase and rewrites it."""

    path: Path
    results: dict = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, identity: dict[str, object]) -> ResultsFile:
        """The file at ``path`` (missing: a new one) continued by a call of ``identity``. ValueError naming the file
        when it is not a JSON object, or when it was made with another identity (a key it lacks is not a mismatch:
        files of older versions)."""
        earlier: object = {}
        if path.exists():
            earlier = read_json(path)
            if not isinstance(earlier, dict):
                raise ValueError(f"{path} is not a results file (a JSON object); give another --out")
        differ = [f"{k}: {earlier[k]!r} there, {v!r} here" for k, v in identity.items() if earlier.get(k, v) != v]
        if differ:
            raise ValueError(
                f"{path} holds results of another machine or settings ({'; '.join(differ)}): adding this run's "
                "would mix them; give another --out"
            )
        return cls(path, earlier | identity)

    def record(self, key: str, value: object) -> None:
        """Set ``key`` and rewrite the file through a rename (an interrupted write leaves the previous file)."""
        self.results[key] = value
        write_atomic(self.path, json.dumps(self.results, indent=1, default=str) + "\n")


def open_results(out: Path, work: Path, identity: dict[str, object]) -> ResultsFile:
    """A GPU recipe's start: ``--out`` and ``--work`` made (or refused: one error line naming the flag, exit 2)
    and ``out/results.json`` opened for ``identity``, before any model is built."""
    import sys

    from fastrl.commands.output_guard import check_output_dir

    try:
        check_output_dir("--out", str(out), {}, overwrite=True)
        check_output_dir("--work", str(work), {}, overwrite=True)
        out.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        return ResultsFile.open(out / "results.json", identity)
    except ValueError as err:
        print(f"{Path(sys.argv[0]).name}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
