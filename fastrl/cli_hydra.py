"""Hydra's command-line conventions on every fastrl command: ``--help``, ``--cfg job|hydra|all`` (``-c``, with a space
or ``=``), ``--resolve``, ``--info``, ``-m`` (multirun) and ``--hydra-help``, through Hydra's own ``main``.

A command runs through Hydra's main when it is `fastrl train` (always: its run directory is Hydra's) or when one of
these flags is given; otherwise commands compose their config with Hydra's compose API (no run directory, no
logging set-up). Hydra's main on a command other than train writes nothing of its own: no ``.hydra/`` folder, no
run directory, no log file, Python logging untouched.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastrl.atomic_files import command_os_error
from fastrl.commands.run_dir import RUN_ID_RESOLVER, register_run_id
from fastrl.config_compose import (
    check_override_keys,
    compose_config,
    conf_dir,
    merge_config,
    quote_string_overrides,
)

MULTIRUN_FLAGS = frozenset({"-m", "--multirun"})
MAX_CHECKED_JOBS = 256  # a sweep of more jobs is checked job by job as it runs (each check composes a config)


def no_run_dir(command: str) -> tuple[str, ...]:
    """Hydra settings for a command that owns no run directory (everything but train): nothing written, logging
    untouched; a multirun records its sweep (Hydra's multirun.yaml) in runs/multirun/<command>-<time>-<id>/."""
    sweep = f"runs/multirun/{command}-${{now:%Y%m%d-%H%M%S}}-${{{RUN_ID_RESOLVER}:}}"
    return (
        "hydra.output_subdir=null",
        "hydra.run.dir=.",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=.",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    )


HELP_TEMPLATE = """${hydra.help.header}
== Config groups (group=option) ==
$APP_CONFIG_GROUPS

== Config (override any key as key=value) ==
$CONFIG
${hydra.help.footer}"""
FLAT_HELP_TEMPLATE = """${hydra.help.header}
== Config (override any key as key=value) ==
$CONFIG
${hydra.help.footer}"""  # a command whose config has no groups (its directory holds only train's)
HELP_FOOTER = """Hydra's flags: --cfg job|hydra|all (-c) prints the config and exits (--resolve resolves it),
--info prints Hydra's view (search path, defaults), -m runs one job per value of comma-separated overrides (a=1,2),
--hydra-help lists all of Hydra's flags."""


@dataclass(frozen=True)
class HydraCommand:
    """One fastrl command as Hydra sees it: its config (``config_dir``/``config_name``.yaml, validated by the
    dataclass ``schema``), the line `fastrl --help` shows for it, and whether it owns a run directory."""

    name: str
    config_dir: Path
    config_name: str
    schema: type
    summary: str
    usage: str
    run_dir: bool = False


BARE_FLAGS = frozenset(
    ("--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r", "--multirun", "-m", "--shell-completion")
)
VALUE_FLAGS = frozenset(
    ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
)
OPTIONAL_VALUE_FLAGS = frozenset(("--info", "-i"))
CFG_CHOICES = ("job", "hydra", "all")
INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


class JobFailed(BaseException):
    """A job's ValueError carried through Hydra's main, which reports (and exits on) every ``Exception``."""

    def __init__(self, error: ValueError) -> None:
        super().__init__(str(error))
        self.error = error


def pop_hydra_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the other arguments), each in the order given: ``-c job``, ``--cfg=job``,
    ``--info`` with or without a choice, ``-m``, ``--help`` ..."""
    flags: list[str] = []
    rest: list[str] = []
    args = iter(enumerate(argv))
    for i, arg in args:
        name, eq, value = arg.partition("=")
        if name in ("--cfg", "-c"):
            _check_cfg(eq and value or (argv[i + 1] if i + 1 < len(argv) else ""))
        if arg in BARE_FLAGS or (name in VALUE_FLAGS | OPTIONAL_VALUE_FLAGS and "=" in arg):
            flags.append(arg)
        elif arg in VALUE_FLAGS:
            if i + 1 >= len(argv):
                raise ValueError(f"{arg} needs a value (e.g. {arg} job)")
            flags += [arg, next(args)[1]]
        elif arg in OPTIONAL_VALUE_FLAGS:
            flags.append(arg)
            if i + 1 < len(argv) and argv[i + 1] in INFO_CHOICES:
                flags.append(next(args)[1])
        else:
            rest.append(arg)
    return flags, rest


def sweep_jobs(overrides: list[str], most: int = MAX_CHECKED_JOBS) -> list[list[str]]:
    """The overrides of each job of a sweep (the product of its comma lists and ranges, in Hydra's basic sweeper's
    order), to check before any job runs; [] when Hydra's parser does not take them (Hydra then says why) or a
    sweep has sweeps only an optimiser expands (glob, interval), or more than ``most`` jobs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return []
    choices: list[list[str]] = []
    for override in parsed:
        if not override.is_sweep_override():
            choices.append([override.input_line])
        elif override.value_type in (ValueType.SIMPLE_CHOICE_SWEEP, ValueType.RANGE_SWEEP):
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            return []
    if math.prod(len(c) for c in choices) > most:
        return []
    return [list(job) for job in itertools.product(*choices)]


def _check_cfg(value: str) -> None:
    if value not in CFG_CHOICES:
        raise ValueError(f"--cfg {value}: choose one of {' | '.join(CFG_CHOICES)} (e.g. --cfg job)")


def run_hydra_main(
    command: HydraCommand,
    argv: list[str],
    task: Callable[[Any], None],
    extra: tuple[str, ...] = (),
    precheck: tuple[str, ...] = (),
) -> None:
    """Run ``task(config object)`` under Hydra's main with ``argv`` (flags and overrides), once or per sweep job.

    Overrides are checked against the schema first (unknown keys named, string values quoted); ``extra``
    overrides go before the user's, so the user's win. Every job's config is composed first with Hydra's compose
    API (``check_jobs``; ``precheck`` overrides added: stand-ins for values only Hydra's main can resolve, such as
    the run directory). A ValueError in the task comes back out as itself.
    """
    import hydra
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    flags, overrides = pop_hydra_flags(argv)
    check_override_keys(command.name, command.schema, overrides)
    check_jobs(command, flags, overrides, precheck)
    register_run_id()
    store = ConfigStore.instance()
    store.store(name=f"{command.config_name}_schema", node=command.schema)
    store.store(group="hydra/help", name=f"fastrl_{command.config_name}", node=_help_node(command))

    @hydra.main(config_path=str(command.config_dir), config_name=command.config_name, version_base="1.3")
    def _main(dcfg: Any) -> None:
        try:
            config = OmegaConf.to_object(dcfg)
        except ValueError as err:
            raise JobFailed(err) from err
        except Exception as err:  # OmegaConf wraps a dataclass's ValueError in its own error types
            raise JobFailed(ValueError(_first_line(err))) from err
        try:
            task(config)
        except ValueError as err:
            raise JobFailed(err) from err
        except OSError as err:  # a full disk: one line (Hydra would print a traceback), as outside Hydra
            # the command's own words where it has any (train's job: resume, or start anew, as its checkpoints allow)
            full = command_os_error(err, "free some space and run the command again (finished work it saved is kept)")
            if full is err:
                raise
            raise JobFailed(full) from err

    quoted = quote_string_overrides(command.schema, overrides, sweep=bool({"-m", "--multirun"} & set(flags)))
    saved = sys.argv
    sys.argv = [f"fastrl {command.name}", f"hydra/help=fastrl_{command.config_name}", *extra, *quoted, *flags]
    try:
        _main()
    except JobFailed as failed:
        raise failed.error from None
    except SystemExit as done:  # --help and --hydra-help exit; 0 is a finished command here, not a process exit
        if done.code not in (0, None):
            raise
    finally:
        sys.argv = saved


def check_jobs(command: HydraCommand, flags: list[str], overrides: list[str], precheck: tuple[str, ...] = ()) -> None:
    """Every job's config composed before Hydra's main, which prints its errors on many lines (after it made a run
    directory): each config error is one ValueError line, naming the key.

    Without flags, or with only ``-m``, the config is composed and validated (each job of a sweep before the first
    job runs). With a flag that prints (``--cfg``, ``--info``, ``--help`` ...) it is only merged: a value of the
    wrong type or a key Hydra cannot add is refused, a value only the command would refuse (a range, a key it
    needs) is printed as given.
    """
    check = compose_config if set(flags) <= MULTIRUN_FLAGS else merge_config
    if not MULTIRUN_FLAGS & set(flags):
        check(command.config_name, command.schema, [*overrides, *precheck], command.config_dir)
        return
    # a sweep's values read as Hydra will read them (quoted: a strategy 3_1_4 is no integer 314)
    for job, job_overrides in enumerate(sweep_jobs(quote_string_overrides(command.schema, overrides, sweep=True))):
        try:
            check(command.config_name, command.schema, [*job_overrides, *precheck], command.config_dir)
        except ValueError as err:
            raise ValueError(f"sweep job {job} ({' '.join(job_overrides)}): {err}; no job was run") from None


def _help_node(command: HydraCommand) -> dict[str, str]:
    header = f"fastrl {command.name}: {command.summary}\n\nexample: {command.usage}\n"
    template = HELP_TEMPLATE if command.config_dir != conf_dir() else FLAT_HELP_TEMPLATE
    return {"app_name": f"fastrl {command.name}", "header": header, "footer": HELP_FOOTER, "template": template}


def _first_line(err: BaseException) -> str:
    """The message of an OmegaConf error without its full_key / object_type lines."""
    cause = err.__cause__ if isinstance(err.__cause__, ValueError) else None
    text = str(cause if cause is not None else err).strip()
    return text.splitlines()[0] if text else type(err).__name__
