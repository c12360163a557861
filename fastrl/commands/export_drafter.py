"""`fastrl export-drafter DIR OUT --format sglang|vllm [bandit_state=FILE]`.

A bandit state records what it was learned with (``setting``: the policy's and the drafter's fingerprints, the
dtype; see ``bandit_state_file``). Of these the export knows the drafter alone: a state learned with another drafter
(or none) is refused, naming both fingerprints, as `fastrl generate` refuses it. The policy the exported drafter
will serve is not here (a drafter directory names its policy, it does not hold it), and the export's dtype is the
served checkpoint's format, not the dtype the state's rounds ran in; a state without a setting (a `fastrl train`
checkpoint's rollout_selector.json, a file written before settings were recorded) is taken as it is."""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from pathlib import Path

from fastrl.commands.bandit_state_file import check_setting, drafter_fingerprint, saved_setting
from fastrl.commands.export_drafter_config import ExportDrafterConfig
from fastrl.commands.output_guard import guard_outputs
from fastrl.commands.staged_output import staged_directory
from fastrl.engine.config import ENGINE_DTYPES
from fastrl.integrations.export.eagle_checkpoint import TOKEN_MAP_FILE, export_eagle_drafter
from fastrl.integrations.export.selection_config import (
    SELECTION_FILES,
    BucketWinner,
    disable_reason,
    exported_strategy,
    read_state,
    selection_files,
    state_winners,
    vllm_plain_note,
)
from fastrl.speculative.drafter_checkpoint import read_drafter_info


def export_overrides(argv: list[str]) -> list[str]:
    """Positional DIR and OUT and ``--format X`` / ``--format=X`` as Hydra overrides; ``key=value`` passes through.
    An argument holding ``=`` is a path when it cannot be a setting (``reads_as_path``)."""
    overrides, positional = [], []
    args = iter(argv)
    for arg in args:
        if arg == "--format":
            value = next(args, None)
            if value is None:
                raise ValueError("export_drafter.format: --format needs a value (sglang or vllm)")
            overrides.append(f"format={value}")
        elif arg.startswith("--format="):
            overrides.append(f"format={arg.split('=', 1)[1]}")
        elif "=" in arg and not reads_as_path(arg):
            overrides.append(arg)
        else:
            positional.append(arg)
    if len(positional) > 2:
        raise ValueError(f"export_drafter: expected DIR OUT, got extra arguments {positional[2:]}")
    keys = ("drafter", "output")
    return [f"{k}={v}" for k, v in zip(keys, positional, strict=False)] + overrides


def reads_as_path(arg: str) -> bool:
    """Whether ``arg``, which holds ``=``, is DIR or OUT rather than a ``key=value`` setting: its key is none of
    export-drafter's (nor Hydra's) and it names an existing path or its key could be no key (``b6/lr=0.1``). A new
    path whose key could be one (``lr=0.1``) is a ValueError saying both readings; a key of export-drafter's always
    reads as the setting (give such a path as ``./format=x``)."""
    key = arg.split("=", 1)[0].lstrip("+~")
    keys = [f.name for f in dataclasses.fields(ExportDrafterConfig)]
    if re.split(r"[./]", key)[0] in [*keys, "hydra"]:
        return False
    if Path(arg).exists() or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
        return True
    near = difflib.get_close_matches(key, keys, n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"its keys are {keys}"
    raise ValueError(
        f"export_drafter: {arg!r} is neither a setting (export-drafter has no key {key!r}; {hint}) nor an existing "
        f"path; give a new output directory whose name holds '=' as ./{arg}"
    )


def read_winners(state_file: str, drafter: str) -> list[BucketWinner]:
    """The bucket winners of ``state_file`` (``state_winners``), once its setting's drafter is ``drafter``'s (a
    ValueError naming both otherwise; see the module docstring) and its setting is not damaged (``saved_setting``)."""
    state = read_state(state_file)
    saved = saved_setting("bandit_state", Path(state_file), state) if isinstance(state, dict) else None
    if saved is not None:
        dtype = saved.get("dtype") if saved.get("dtype") in ENGINE_DTYPES else "float32"
        here = {"drafter": drafter_fingerprint(Path(drafter), dtype)}  # as the run that learned it held the drafter
        check_setting("bandit_state", Path(state_file), state, here, f"the drafter {drafter}")
    prior = read_drafter_info(drafter).prior_hazard  # what the engine told the bandit at start
    return state_winners(state, f"bandit_state={state_file}", prior)


def run_export_drafter(config: ExportDrafterConfig) -> None:
    """Write the EAGLE checkpoint (and, given a bandit state, the selection configs) and print what was written.
    Every input is checked before anything is written; files go to a staging directory renamed into place."""
    inputs = {"drafter": config.drafter, "bandit_state": config.bandit_state}
    with guard_outputs({}, inputs, {"output": config.output}, config.overwrite) as targets:
        winners = read_winners(config.bandit_state, config.drafter) if config.bandit_state else []
        final = targets["output"].path
        # an earlier export's token map or selection configs would restrict or steer this drafter: they go
        with staged_directory(targets["output"], owned=(TOKEN_MAP_FILE, *SELECTION_FILES)) as staging:
            exported = export_eagle_drafter(
                config.drafter, staging, config.format, config.dtype, config.drop_fc_bias, config.full_vocab
            )
            if winners:
                for name, text in selection_files(winners, str(final.resolve())).items():  # vLLM's "model"
                    (staging / name).write_text(text)
        print(f"wrote {exported.format} EAGLE drafter ({exported.architecture}, {exported.dtype}) to {final}")
        if exported.token_map is not None:
            print(
                f"  draft vocabulary of {exported.draft_vocab_size} tokens: serve with "
                f"--speculative-token-map {final / exported.token_map.name}"
            )
        for w in winners:
            reason = disable_reason(w)
            shown = f"{w.strategy} (exported as {exported_strategy(w)})" if w.strategy.stop_below else str(w.strategy)
            print(f"  batch size {w.label:>6}: {shown}" + (f" (plain decoding: {reason})" if reason else ""))
        note = vllm_plain_note(winners) if winners else None
        if note:
            print(f"fastrl export-drafter: warning: {final / SELECTION_FILES[0]}: {note}", file=sys.stderr)
