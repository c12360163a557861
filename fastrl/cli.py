"""The `fastrl` command line: `fastrl <command> key=value ...` with Hydra overrides."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from importlib import import_module
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastrl.cli_hydra import HydraCommand

# name: (what it does, an example)
SUMMARIES = {
    "train": ("GRPO with speculative, adaptive rollouts", "fastrl train rl.steps=20 strategy=bandit"),
    "generate": ("complete prompts from a JSONL file", "fastrl generate prompts=in.jsonl output=out.jsonl"),
    "bench": ("speed: fastrl vs plain vs HF generate", "fastrl bench suites=[spec_bs1]"),
    "train-drafter": ("fit an EAGLE drafter offline", "fastrl train-drafter output=runs/drafter"),
    "check-exact": ("speculative vs plain, mismatches judged", "fastrl check-exact prompts=in.jsonl strategy=4_3_10"),
    "export-drafter": ("a drafter for SGLang / vLLM", "fastrl export-drafter DIR OUT --format sglang"),
}


def usage() -> str:
    """`fastrl --help`: the commands with one example each."""
    rows = "\n".join(f"  {name:<15}{summary:<42} {example}" for name, (summary, example) in SUMMARIES.items())
    return (
        "usage: fastrl <command> [key=value ...] [--help | --cfg job | --info | -m]\n\ncommands:\n"
        f"{rows}\n\nEvery key of the command's config (under fastrl/conf/) can be overridden as key=value;\n"
        "`fastrl <command> --help` lists them with their defaults."
    )


def _command(name: str) -> HydraCommand:
    """The Hydra view of command `name`: its config, schema and usage line."""
    from fastrl.cli_hydra import HydraCommand
    from fastrl.config_compose import conf_dir

    summary, example = SUMMARIES[name]
    config_name = name.replace("-", "_")
    if name == "train":
        from fastrl.commands.train_config import TrainConfig

        return HydraCommand(name, conf_dir() / "train", "train", TrainConfig, summary, example, run_dir=True)
    schema = {
        "generate": ("fastrl.commands.generate_config", "GenerateConfig"),
        "bench": ("fastrl.commands.bench_config", "BenchConfig"),
        "train-drafter": ("fastrl.commands.train_drafter_config", "TrainDrafterConfig"),
        "check-exact": ("fastrl.commands.check_exact_config", "CheckExactConfig"),
        "export-drafter": ("fastrl.commands.export_drafter_config", "ExportDrafterConfig"),
    }[name]
    return HydraCommand(name, conf_dir(), config_name, getattr(import_module(schema[0]), schema[1]), summary, example)


def _run_command(name: str, argv: list[str], task: Callable[[Any], int | None]) -> int | None:
    """Compose the config (Hydra's compose API) and run `task` on it; with a Hydra flag, go through Hydra's main."""
    from fastrl.cli_hydra import no_run_dir, pop_hydra_flags, run_hydra_main
    from fastrl.config_compose import compose_config

    command = _command(name)
    flags, overrides = pop_hydra_flags(argv)
    if not flags:
        return task(compose_config(command.config_name, command.schema, overrides))
    codes: list[int] = []
    run_hydra_main(command, flags + overrides, lambda cfg: codes.append(task(cfg) or 0), no_run_dir(name))
    return max(codes, default=0)


def _generate(argv: list[str]) -> int | None:
    from fastrl.commands.generate import generate_exit_code, run_generate

    return _run_command("generate", argv, lambda cfg: generate_exit_code(run_generate(cfg)))


def _bench(argv: list[str]) -> None:
    from fastrl.commands.bench import run_bench

    _run_command("bench", argv, lambda cfg: _exit_code_of_results(run_bench(cfg)))


def _train_drafter(argv: list[str]) -> None:
    from fastrl.commands.train_drafter import run_train_drafter

    _run_command("train-drafter", argv, lambda cfg: _exit_code_of_results(run_train_drafter(cfg)))


def _exit_code_of_results(results: object) -> int:
    """0: a command that returns its results (a report, a payload) finished; a Hydra multirun collects the jobs'
    exit codes, not their results."""
    return 0


def _check_exact(argv: list[str]) -> int | None:
    from fastrl.commands.check_exact import check_exact_exit_code, run_check_exact

    return _run_command("check-exact", argv, lambda cfg: check_exact_exit_code(run_check_exact(cfg)))


def _export_drafter(argv: list[str]) -> None:
    from fastrl.cli_hydra import pop_hydra_flags
    from fastrl.commands.export_drafter import export_overrides, run_export_drafter

    flags, rest = pop_hydra_flags(argv)
    _run_command("export-drafter", flags + export_overrides(rest), run_export_drafter)


def _train(argv: list[str]) -> None:
    from fastrl.commands.train import hydra_entry

    hydra_entry(_command("train"), argv)


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


def _print_usage() -> int:
    """Print the usage; a reader that stops early (``fastrl -h | head -3``) ends it quietly, not in a traceback."""
    try:
        print(usage(), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
    return 0


def main(argv: list[str] | None = None, exiting: bool = False) -> int:
    """Entry point; returns the process exit code (2 for bad input, with one line naming the problem). ``exiting``:
    the process ends with the code (the ``fastrl`` command): an interrupted command then ignores further SIGINT and
    SIGTERM, so that one arriving while the interpreter shuts down cannot turn its exit 130 into death by signal."""
    argv = list(sys.argv[1:] if argv is None else argv)
    table = commands()
    if not argv or argv[0] in ("-h", "--help", "help"):
        return _print_usage()
    name, overrides = argv[0], argv[1:]
    if name not in table:
        print(f"fastrl: unknown command {name!r}; choose one of {sorted(table)}\n\n{usage()}", file=sys.stderr)
        return 2
    previous = signal.getsignal(signal.SIGTERM)
    if previous != signal.SIG_IGN:  # an ignored SIGTERM (inherited from the parent) stays ignored
        signal.signal(signal.SIGTERM, _terminate)  # cleanup (Ray shutdown, output flush) runs on SIGTERM too
    try:
        code = table[name](overrides)
    except ValueError as exc:
        from fastrl.config_compose import UnknownKeyError, in_schema_words

        said = str(exc) if isinstance(exc, UnknownKeyError) else in_schema_words(str(exc), _command(name).schema)
        print(f"fastrl {name}: error: {said}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk mid-run: one line, what was saved before is kept; anything else as it is
        from fastrl.atomic_files import command_os_error

        full = command_os_error(exc, "free some space and run the command again (finished work it saved is kept)")
        if full is exc:
            raise
        print(f"fastrl {name}: error: {full}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        if exiting:  # everything finished is saved: a second signal changes nothing but the exit status
            previous = signal.SIG_IGN
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not getattr(exc, "reported", False):  # a command that said what was kept and what to do marks it so
            print(f"fastrl {name}: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code or 0


def entry() -> int:
    """The ``fastrl`` command: ``main`` for a process that exits with its code."""
    return main(exiting=True)


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` (worker and Ray shutdown) runs."""
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(entry())
