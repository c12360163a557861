"""`fastrl generate`: complete the prompts of a JSONL file with the engine, streaming results as requests finish.

Order of work: check every setting and output path, read and check every prompt, load the model, then generate.
Results go to `output` as they finish (see ``result_stream``); an interrupted run is resumed by running the same
command again (the finished lines are kept, only the rest is generated).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fastrl.adaptive.bandit import BanditSelector
from fastrl.atomic_files import NoSpaceError, no_space
from fastrl.commands.bandit_state_file import (
    check_setting,
    config_setting,
    learned_setting,
    module_fingerprint,
    read_state_file,
    write_state_file,
)
from fastrl.commands.decode_inputs import read_ema_json, to_generate_inputs
from fastrl.commands.engine_setup import build_engine, check_kv_memory, model_inputs, request_context, resolve_model_dir
from fastrl.commands.generate_config import GenerateConfig
from fastrl.commands.interrupted import say_interrupted
from fastrl.commands.multirun import job_file
from fastrl.commands.output_guard import GuardedOutputs, guard_outputs, image_file_problem, write_through
from fastrl.commands.prompt_tokens import PromptLimits
from fastrl.commands.prompts_io import PromptLine, read_prompts
from fastrl.commands.result_stream import INDEX_KEY, ResultStream
from fastrl.commands.round_ledger import RoundLedger
from fastrl.engine.engine import GenerateInput
from fastrl.engine.heap import settled_heap
from fastrl.engine.request import RequestOutput
from fastrl.interrupts import held_interrupts
from fastrl.models.checkpoint import (
    DIGEST_PREFIX,
    config_fingerprint,
    load_model,
    read_config,
    weights_fingerprint,
    weights_heads_fingerprint,
)
from fastrl.models.tokenizer import load_tokenizer
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.selector import StrategySelector
from fastrl.telemetry.run_stats import (
    READ_ERRORS,
    plot_run,
    read_recorded_run,
    read_round_log,
    stats_results,
    write_run_plot,
    write_run_stats,
)
from fastrl.telemetry.speed_summary import print_generate_summary


def generate_exit_code(records: list[dict[str, Any]]) -> int:
    """1 when any request ended in an error (its line says why; every other result is kept), else 0."""
    return 1 if any(record.get("error") for record in records) else 0


def run_generate(cfg: GenerateConfig) -> list[dict[str, Any]]:
    """Generate for every prompt line not already in the output, streaming records to it; returns every record
    (kept and new) in prompt order."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # a multirun's jobs write their own results (a bandit state is carried from job to job)
    outputs = {key: job_file(getattr(cfg, key)) for key in ("output", "stats_output", "plot_output")}
    cfg = dataclasses.replace(cfg, **outputs)
    model_dir = resolve_model_dir(cfg.model)
    targets = guard_outputs(
        {
            "output": cfg.output,
            "stats_output": cfg.stats_output,
            "plot_output": cfg.plot_output,
            "bandit_state": cfg.bandit_state,
        },
        {"prompts": cfg.prompts, "ema_json": cfg.ema_json, **model_inputs(model_dir, cfg.drafter)},
        own={"stats_output": stats_file_problem, "plot_output": image_file_problem},
    )
    try:
        ema = read_ema_json(cfg.ema_json) if cfg.ema_json else cfg.ema
        learned = read_state_file("bandit_state", targets["bandit_state"].path) if cfg.bandit_state else None
        if learned is not None:  # the dtype and the drafter's files tell their part of its setting before any work
            check_setting("bandit_state", targets["bandit_state"].path, learned, config_setting(cfg, model_dir))
        lines = read_prompts(cfg.prompts)
        cfg.check_workload("generate", len(lines))
        tokenizer = load_tokenizer(model_dir)
        model_config = read_config(model_dir)
        limits = PromptLimits(model_config.max_position_embeddings, model_config.vocab_size)
        inputs = [x for line in lines for x in to_generate_inputs(line, cfg, tokenizer, limits)]
        context = request_context(model_config, [len(x.prompt_ids) for x in inputs], cfg.max_new_tokens)
        engine_config = cfg.engine_config(max(1, min(cfg.batch_size, len(inputs))), context)
        check_kv_memory(
            "batch_size", model_config, engine_config.max_batch_size, engine_config.torch_dtype, cfg.device, context
        )
        stream = ResultStream(targets["output"], cfg.resume)
        settings = run_settings(cfg, model_dir)
        _check_kept(stream.done, inputs, lines, cfg, settings, model_dir)
        pending = [(i, x) for i, x in enumerate(inputs) if i not in stream.done]
        if not pending:
            stream.finish()
            print(
                f"fastrl generate: all {len(inputs)} results are already in {cfg.output}; nothing to do"
                f"{finished_reports(targets, set(stream.done))}",
                file=sys.stderr,
            )
            return [stream.done[i] for i in sorted(stream.done)]
        earlier, covered = earlier_rounds(targets, set(stream.done), stream.redone)
        model = load_model(model_dir, engine_config.torch_dtype, cfg.device)
        if learned is not None:  # the policy's part, before the calibration
            check_setting("bandit_state", targets["bandit_state"].path, learned, {"policy": module_fingerprint(model)})
        engine = build_engine(model, model_dir, cfg.strategy, cfg.drafter, engine_config, bandit=cfg.bandit, ema=ema)
        setting = learned_setting(engine) if "bandit_state" in targets else {}  # what a saved state belongs to
        if learned is not None:
            check_setting("bandit_state", targets["bandit_state"].path, learned, setting)  # the engine's own
            selector = engine.selector  # a bandit (bandit_state needs one): acceptance and round times learned before
            selector.warm_start(learned, calibration=not selector.calibrated)  # its own calibration stays
        if stream.done:
            print(f"fastrl generate: resuming {cfg.output}: {len(stream.done)} of {len(inputs)} done", file=sys.stderr)
        stream.open()
        kept_before = set(stream.done)

        def made() -> set[int]:  # the results whose rounds the stats hold: the merged ones' and this run's
            return covered | (set(stream.done) - kept_before)

        def save_stopped() -> None:  # a stopped run's bandit state and the reports of the results it wrote
            save_learned(targets, engine.selector, setting, learned)
            written = {inputs[i].request_id for i in stream.done}
            write_reports(targets, earlier + ledger.kept(written), cfg.strategy, engine.selector, made())

        def write(step: list[tuple[int, RequestOutput]]) -> None:  # the results that finished in one step
            for index, out in step:
                record = _to_record(index, out, tokenizer, settings)
                if cfg.n > 1:
                    record["prompt_index"], record["sample"] = divmod(index, cfg.n)
                stream.write(record)
                if record.get("error"):
                    print(f"fastrl generate: line {lines[index // cfg.n].line_no}: {record['error']}", file=sys.stderr)

        ledger = RoundLedger(engine)
        try:
            with settled_heap():  # start-up's objects out of the collector's way while decoding
                _generate_pending(ledger, pending, cfg.progress, write)
            stream.close()
        except KeyboardInterrupt as err:
            stream.close()
            save_stopped()
            raise say_interrupted(
                err,
                f"fastrl generate: interrupted; {len(stream.done)} of {len(inputs)} results are in {cfg.output}. "
                "Run the same command again to finish.",
            ) from None
        except OSError as err:
            stream.close()
            _try_reports(targets, save_stopped)
            kept = f"{cfg.output}; {len(stream.done)} of {len(inputs)} results are kept; run the same command again"
            full = no_space(err, kept)
            if full is err:
                raise
            raise full from None
        rounds = earlier + engine.round_stats
        print_generate_summary(rounds, engine.selector)
        failed = sum(1 for record in stream.done.values() if record.get("error"))
        if failed:
            print(
                f'fastrl generate: {failed} of {len(stream.done)} requests failed (finish_reason "error"; the '
                f'"error" of each such line in {cfg.output} says why)',
                file=sys.stderr,
            )
        save_learned(targets, engine.selector, setting, learned)
        write_reports(targets, rounds, cfg.strategy, engine.selector, made())
        try:  # last: the rewrite in prompt order needs a second copy of the output, which a full disk may not hold
            stream.finish()
        except NoSpaceError as err:
            raise ValueError(
                f"{err} (every result is in it, in the order they finished; the stats and the bandit state are "
                "written): run the same command again with space to put them in prompt order"
            ) from None
        return [stream.done[i] for i in sorted(stream.done)]
    finally:
        targets.release()


STATS_KEYS = ("bucket_thresholds", ("strategy_selector", "strategy_policy"))
"""Entries every stats JSON a `fastrl generate` run writes holds (``run_stats``), whatever its version: a tuple is
one of its names (earlier versions called the selector the strategy policy and kept no round log)."""


def stats_file_problem(path: Path) -> str | None:
    """Why an existing stats_output file is no stats JSON of a `fastrl generate` run (``Recognise``: it is not
    overwritten); None when it is one: a rerun rewrites it, a resumed run merges its rounds."""
    what = "is not the stats JSON of a `fastrl generate` run"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{what} ({type(err).__name__}: {err})"
    if not isinstance(data, dict):
        return f"{what} (a JSON {type(data).__name__}, not an object)"
    for key in STATS_KEYS:
        names = key if isinstance(key, tuple) else (key,)
        if not any(name in data for name in names):
            return f"{what} (it has no {names[0]!r})"
    return None


def finished_reports(targets: GuardedOutputs, done: set[int]) -> str:
    """With every result already in the output: a missing plot_output is drawn from the round log stats_output
    holds; returns the end of the "nothing to do" line, saying what is left as it is and what is not written, and
    why (the rounds behind the results are kept only in a stats_output file)."""
    stats = targets["stats_output"] if "stats_output" in targets else None
    plot = targets["plot_output"] if "plot_output" in targets else None
    left = [f"{t.key}={t.path}" for t in (stats, plot) if t is not None and t.exists]
    note = f" ({' and '.join(left)} left as {'they are' if len(left) > 1 else 'it is'})" if left else ""
    if stats is not None and not stats.exists:
        missing = [f"{t.key}={t.path}" for t in (stats, plot) if t is not None and not t.exists]
        return (
            f"{note}; {' and '.join(missing)} not written: the rounds that made these results are kept in no stats "
            f"file here ({stats.path} does not exist: the run that made them had another stats_output or none, or "
            "was stopped before writing it); resume=false generates the results again with them"
        )
    if plot is None or plot.exists:
        return note
    if stats is None:
        return (
            f"{note}; plot_output={plot.path} not written: it is drawn from the rounds that made these results, "
            "which only a stats_output file keeps: name the one their run wrote, or pass resume=false to generate "
            "them again"
        )
    if not stats.regular:
        return f"{note}; plot_output={plot.path} not written: stats_output={stats.path} is no file to read rounds from"
    try:
        run = read_recorded_run(stats.path)
        covered = stats_results(stats.path)
    except READ_ERRORS as err:
        return (
            f"{note}; plot_output={plot.path} not written: stats_output={stats.path} is not the stats of a fastrl "
            f"generate run ({type(err).__name__}: {err}), so it holds no rounds to draw it from"
        )
    if covered is not None and covered != done:
        return (
            f"{note}; plot_output={plot.path} not written: stats_output={stats.path} holds the rounds of "
            f"{len(covered)} of these {len(done)} results (a run was stopped before it wrote its stats); "
            "resume=false generates them again with all their rounds"
        )
    write_through(plot, lambda path: plot_run(path, run.rounds, run.selector_name, run.thresholds))
    return f"{note}; plot_output={plot.path} drawn from the rounds in stats_output={stats.path}"


def earlier_rounds(
    targets: GuardedOutputs, kept: set[int], redone: set[int] = frozenset()
) -> tuple[list[RoundStats], set[int]]:
    """The rounds an interrupted earlier run wrote to stats_output, for a resumed run to merge with its own, and
    the results they made (([], set()) for a fresh run, or when there is no stats file of the ``kept`` results to
    merge: a later run over the same output may have been stopped before it wrote its own). The results of
    ``redone`` lines (error records, run again) may be among them: their rounds were run too."""
    if not kept or "stats_output" not in targets:
        return [], set()
    stats = targets["stats_output"]
    if not stats.exists:
        print("fastrl generate: stats_output covers only the rest: the earlier run wrote no stats", file=sys.stderr)
        return [], set()
    rounds = read_round_log(stats.path)
    covered = stats_results(stats.path)
    if covered is None:  # written before stats said which results they are of: taken as the kept ones'
        return rounds, set(kept)
    if covered - redone != kept:
        print(
            f"fastrl generate: stats_output covers only the rest: {stats.path} holds the rounds of {len(covered)} "
            f"other results than the {len(kept)} kept (a later run was stopped before it wrote its stats)",
            file=sys.stderr,
        )
        return [], set()
    return rounds, covered - redone


def save_learned(targets: GuardedOutputs, selector: StrategySelector, setting: dict, earlier: dict | None) -> None:
    """bandit_state: what the bandit learned (in ``setting``), for the next run to start from, with what the file
    held before (``earlier``) of arms this run did not have."""
    if "bandit_state" in targets and isinstance(selector, BanditSelector):
        write_state_file(targets["bandit_state"], selector, setting, earlier)


def write_reports(
    targets: GuardedOutputs,
    rounds: list[RoundStats],
    name: str,
    selector: StrategySelector,
    results: set[int] | None = None,
) -> None:
    """stats_output (saying which ``results`` its rounds made) and plot_output of ``rounds``, each written to a
    temporary file renamed into place; a plot that cannot be drawn (matplotlib's error) is one ValueError naming
    the key, after the stats are written."""
    made = None if results is None else sorted(results)
    if "stats_output" in targets:
        write_through(targets["stats_output"], lambda path: write_run_stats(path, rounds, name, selector, made))
    if "plot_output" in targets:
        try:
            write_through(targets["plot_output"], lambda path: write_run_plot(path, rounds, name, selector))
        except (RuntimeError, OSError, ValueError) as err:
            if isinstance(err, OSError) and no_space(err, "") is not err:  # a full disk: said as one for every file
                raise
            raise ValueError(
                f"plot_output={targets['plot_output'].path}: not drawn ({type(err).__name__}: {err}); the results, "
                "the stats and the bandit state are written"
            ) from None


def _generate_pending(
    ledger: RoundLedger,
    pending: list[tuple[int, GenerateInput]],
    progress: bool,
    write: Callable[[list[tuple[int, RequestOutput]]], None],
) -> None:
    """Run every pending request to its end, handing ``write`` the (prompt index, output) of those that finish in
    each step. An interrupt waits for the end of a step and of writing its finished results (a result a step
    returned is written); one the ledger caught in its step (``RoundLedger.interrupt``) is raised after them."""
    from tqdm.auto import tqdm

    engine = ledger.engine
    index_of = {}
    for index, x in pending:
        index_of[engine.add_request(x.prompt_ids, x.params, x.request_id)] = index
    with tqdm(total=len(pending), desc="generate", unit="req", disable=not progress) as bar:
        while engine.has_unfinished():
            with held_interrupts("a step and writing its results", raising_only=True):
                done = [(index_of[out.request_id], out) for out in ledger.step() if out.finished]
                bar.update(len(done))
                write(done)
            if ledger.interrupt is not None:
                raise ledger.interrupt


def _try_reports(targets: GuardedOutputs, save: Callable[[], None]) -> None:
    """``save`` the bandit state and reports of a run that an error stopped, best-effort: a failure (the disk is
    full) is said in one line, naming what may be missing, and the error that stopped the run stays the one raised."""
    try:
        save()
    except Exception as err:  # whatever it is, the error that stopped the run comes first
        keys = ("bandit_state", "stats_output", "plot_output")
        named = ", ".join(f"{key}={targets[key].path}" for key in keys if key in targets)
        print(f"fastrl generate: writing {named} failed too: {type(err).__name__}: {err}", file=sys.stderr)


def run_settings(cfg: GenerateConfig, model_dir: Path) -> dict[str, Any]:
    """What decides a result besides its prompt and seed: the model's weights (``weights_fingerprint``; ``model`` is
    the name it was given, for the reader) and configuration (``config_fingerprint``: its RoPE, norms, stop ids),
    the dtype and the sampling keys (each record carries them, so a rerun that would mix results of other settings
    into one file is refused)."""
    keys = ("model", "dtype", "n", "max_new_tokens", "temperature", "top_p", "top_k")
    fingerprints = {"weights": weights_fingerprint(model_dir), "model_config": config_fingerprint(model_dir)}
    return {key: getattr(cfg, key) for key in keys} | fingerprints


def _check_kept(
    done: dict[int, dict[str, Any]],
    inputs: list[GenerateInput],
    lines: list[PromptLine],
    cfg: GenerateConfig,
    settings: dict[str, Any],
    model_dir: Path,
) -> None:
    """The records an earlier run left must be made with these settings (records of files written before records
    carried them are taken as made with them), then be results of these prompts with these seeds. The settings come
    first: results of another ``n`` sit at other indices, so they would read as results of other prompts. Records
    written before ``weights_fingerprint`` hashed every weight carry the older fingerprint, compared as it was."""
    fingerprints = {"digest": settings["weights"]}  # by the recipe of the records' fingerprints
    for index in sorted(done):
        kept = done[index].get("settings", settings)
        keys = [k for k in settings if k not in ("model", "weights", "model_config")]
        differ = [f"{k}={kept.get(k)!r} (now {settings[k]!r})" for k in keys if kept.get(k) != settings[k]]
        # the model is told by its weights, whatever path named it; a record written before they were kept, by name
        if "weights" in kept:
            recipe = "digest" if str(kept["weights"]).startswith(DIGEST_PREFIX) else "heads"
            if recipe not in fingerprints:
                fingerprints[recipe] = weights_heads_fingerprint(model_dir)
            if kept["weights"] != fingerprints[recipe]:
                differ.append(f"the weights of model={kept.get('model')!r} (now other weights, model={cfg.model!r})")
        elif kept.get("model") != settings["model"]:
            differ.append(f"model={kept.get('model')!r} (now {settings['model']!r})")
        # a record written before the configuration was kept is checked on the rest
        if "model_config" in kept and kept["model_config"] != settings["model_config"]:
            differ.append(f"the configuration of model={cfg.model!r} (its config.json or generation_config.json)")
        if differ:
            raise ValueError(
                f"output={cfg.output} holds results made with other settings: {', '.join(differ)}; resuming would "
                "mix them into one file: rerun with those settings, delete it, pass resume=false, or name another "
                "output"
            )
    redo = "delete it or pass resume=false"
    for index in sorted(done):
        record, (prompt, sample) = done[index], divmod(index, cfg.n)
        of_sample = f' ("sample": {sample})' if cfg.n > 1 else ""
        if index < 0:
            raise ValueError(f'output={cfg.output} holds a result with "index": {index}, which names no prompt; {redo}')
        if prompt >= len(lines):
            count = f"{len(lines)} prompt{'' if len(lines) == 1 else 's'}"
            count += f" (x n={cfg.n}: {len(inputs)} results)" if cfg.n > 1 else ""
            raise ValueError(
                f"output={cfg.output} holds a result for prompt {prompt + 1}{of_sample}, but prompts={cfg.prompts} "
                f"has {count}: its results are of another prompts file; {redo}"
            )
        x, where = inputs[index], f"line {lines[prompt].line_no} of prompts={cfg.prompts}{of_sample}"
        if record.get("prompt_ids") != x.prompt_ids:
            raise ValueError(
                f"output={cfg.output} holds a result for {where} made from another prompt (its prompt_ids differ "
                f"from this line's): the results are of another prompts file, or the line changed; {redo}"
            )
        if record.get("seed") != x.params.seed:
            raise ValueError(
                f"output={cfg.output} holds a result for {where} made with seed {record.get('seed')!r}, but this "
                f'run samples it with seed {x.params.seed} (seed= or the line\'s "seed" changed): rerun with the '
                f"earlier seed, {redo}"
            )


def _to_record(index: int, out: RequestOutput, tokenizer: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """One output line. A non-finite log-probability (the model produced NaN or infinite logits) makes the request
    an error: its tokens are meaningless, and NaN is not JSON."""
    finite = all(math.isfinite(x) for x in out.logprobs)
    record: dict[str, Any] = {
        INDEX_KEY: index,
        "prompt_ids": out.prompt_ids,
        "token_ids": out.token_ids,
        "logprobs": out.logprobs if finite else [x if math.isfinite(x) else None for x in out.logprobs],
        "finish_reason": out.finish_reason.value if out.finish_reason else None,
        "seed": out.seed,
        "accept_lengths": out.accept_lengths,
        "settings": settings,
    }
    if tokenizer is not None:
        record["text"] = tokenizer.decode(out.token_ids, skip_special_tokens=True)
    if out.error:
        record["error"] = out.error
    elif not finite:
        first = next(i for i, x in enumerate(out.logprobs) if not math.isfinite(x))
        record["finish_reason"] = "error"
        record["error"] = f"non-finite logits at generated token {first}: the model's output is NaN or infinite"
    return record
