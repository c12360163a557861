"""The `fastrl` command line: `fastrl <command> key=value ...` with Hydra overrides."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

USAGE = """usage: fastrl <command> [key=value ...]

commands:
  train          GRPO with speculative, adaptive rollouts   fastrl train rl.steps=20 strategy=bandit
  generate       complete prompts from a JSONL file         fastrl generate prompts=in.jsonl output=out.jsonl
  bench          speed: fastrl vs plain vs HF generate      fastrl bench suites=[spec_bs1]
  train-drafter  fit an EAGLE drafter offline               fastrl train-drafter output=runs/drafter
  check-exact    speculative vs plain, mismatches judged    fastrl check-exact prompts=in.jsonl strategy=4_3_10
  export-drafter a drafter for SGLang / vLLM                 fastrl export-drafter DIR OUT --format sglang

Every key of the command's config (fastrl/conf/<command>.yaml) can be overridden as key=value.
"""


def _generate(overrides: list[str]) -> None:
    from fastrl.commands.generate import run_generate
    from fastrl.commands.generate_config import GenerateConfig
    from fastrl.config_compose import compose_config

    run_generate(compose_config("generate", GenerateConfig, overrides))


def _bench(overrides: list[str]) -> None:
    from fastrl.commands.bench import run_bench
    from fastrl.commands.bench_config import BenchConfig
    from fastrl.config_compose import compose_config

    run_bench(compose_config("bench", BenchConfig, overrides))


def _train_drafter(overrides: list[str]) -> None:
    from fastrl.commands.train_drafter import run_train_drafter
    from fastrl.commands.train_drafter_config import TrainDrafterConfig
    from fastrl.config_compose import compose_config

    run_train_drafter(compose_config("train_drafter", TrainDrafterConfig, overrides))


def _check_exact(overrides: list[str]) -> int:
    from fastrl.commands.check_exact import check_exact_exit_code, run_check_exact
    from fastrl.commands.check_exact_config import CheckExactConfig
    from fastrl.config_compose import compose_config

    return check_exact_exit_code(run_check_exact(compose_config("check_exact", CheckExactConfig, overrides)))


def _export_drafter(argv: list[str]) -> None:
    from fastrl.commands.export_drafter import export_overrides, run_export_drafter
    from fastrl.commands.export_drafter_config import ExportDrafterConfig
    from fastrl.config_compose import compose_config

    run_export_drafter(compose_config("export_drafter", ExportDrafterConfig, export_overrides(argv)))


def _train(overrides: list[str]) -> None:
    from fastrl.commands.train import hydra_entry

    hydra_entry(overrides)


def commands() -> dict[str, Callable[[list[str]], int | None]]:
    """The subcommands by name; each returns its exit code (None: 0)."""
    return {
        "train": _train,
        "generate": _generate,
        "bench": _bench,
        "train-drafter": _train_drafter,
        "check-exact": _check_exact,
        "export-drafter": _export_drafter,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (2 for bad input, with one line naming the problem)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    table = commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    name, overrides = argv[0], argv[1:]
    if name not in table:
        print(f"fastrl: unknown command {name!r}; choose one of {sorted(table)}\n\n{USAGE}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _terminate)  # cleanup (Ray shutdown, output flush) runs on SIGTERM too
    try:
        code = table[name](overrides)
    except ValueError as exc:
        print(f"fastrl {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastrl {name}: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code or 0


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` (worker and Ray shutdown) runs."""
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
