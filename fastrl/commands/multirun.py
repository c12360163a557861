"""Files of one job of a Hydra multirun (``-m``): each job writes its own, named after its job number."""

from __future__ import annotations

from pathlib import Path


def multirun_job() -> int | None:
    """The job number inside a Hydra multirun, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return int(HydraConfig.get().job.num)


def job_file(path: str) -> str:
    """``path`` as this job writes it: ``out.jsonl`` -> ``out.job3.jsonl`` in job 3 of a multirun (the jobs would
    otherwise write over each other, or resume each other's results); unchanged outside one, or when empty."""
    job = multirun_job()
    if job is None or not path:
        return path
    given = Path(path)
    return str(given.with_name(f"{given.stem}.job{job}{given.suffix}"))
