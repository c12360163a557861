"""`fastrl check-exact`: decode a prompts file plainly and speculatively; report and judge every difference."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from fastrl.commands.check_exact_config import CheckExactConfig
from fastrl.commands.decode_inputs import read_ema_json, to_generate_inputs
from fastrl.commands.engine_setup import (
    build_engine,
    check_kv_memory,
    model_inputs,
    request_context,
    resolve_model_dir,
)
from fastrl.commands.output_guard import GuardedOutputs, guard_outputs, write_text
from fastrl.commands.prompt_tokens import PromptLimits
from fastrl.commands.prompts_io import read_prompts
from fastrl.engine.request import RequestOutput
from fastrl.exactness.compare import ExactnessReport, compare_runs
from fastrl.models.checkpoint import load_model, read_config
from fastrl.models.tokenizer import load_tokenizer

EXIT_BUG = 1


def run_check_exact(cfg: CheckExactConfig) -> ExactnessReport:
    """Both runs, compared request by request; prints one line per differing request and a summary."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model_dir = resolve_model_dir(cfg.model)
    inputs = {"prompts": cfg.prompts, "ema_json": cfg.ema_json, **model_inputs(model_dir, cfg.drafter)}
    with guard_outputs({"report": cfg.report}, inputs) as targets:
        return _check(cfg, model_dir, targets)


def _check(cfg: CheckExactConfig, model_dir: Path, targets: GuardedOutputs) -> ExactnessReport:
    lines = read_prompts(cfg.prompts)
    cfg.check_workload("check_exact", len(lines))
    tokenizer = load_tokenizer(model_dir)
    model_config = read_config(model_dir)
    limits = PromptLimits(model_config.max_position_embeddings, model_config.vocab_size)
    inputs = [x for line in lines for x in to_generate_inputs(line, cfg, tokenizer, limits)]
    ema = read_ema_json(cfg.ema_json) if cfg.ema_json else cfg.ema
    context = request_context(model_config, [len(x.prompt_ids) for x in inputs], cfg.max_new_tokens)
    configs = {}
    for name, key, batch in (
        ("plain", "plain_batch_size", cfg.plain_batch_size or cfg.batch_size),
        ("speculative", "batch_size", cfg.batch_size),
    ):
        slots = min(batch, len(inputs))
        configs[name] = cfg.engine_config(slots, context)
        check_kv_memory(key, model_config, slots, configs[name].torch_dtype, cfg.device, context)
    policy = load_model(model_dir)
    runs = {}
    for name, strategy in (("plain", "disable"), ("speculative", cfg.strategy)):
        engine = build_engine(
            policy, model_dir, strategy, cfg.drafter, configs[name], bandit=cfg.bandit, ema=ema, estimate_speedup=False
        )  # no speed is reported: a fixed strategy's calibration would be time spent for nothing
        runs[name] = engine.generate(inputs, progress=cfg.progress)
    report = compare_runs(engine.model, inputs, runs["plain"], runs["speculative"], cfg.logprob_tol)
    refused = ended_alike = 0
    for index, item in enumerate(report.items):
        where = f"line {lines[index // cfg.n].line_no}" + (f" sample {index % cfg.n + 1}/{cfg.n}" if cfg.n > 1 else "")
        m = item.mismatch
        plain, spec = runs["plain"][index], runs["speculative"][index]
        same_error = plain.error is not None and plain.error == spec.error
        if same_error and not plain.token_ids and not spec.token_ids:
            refused += 1  # both ended it before its first token: nothing was generated to compare
            print(f"{where}: not checked, both runs refused it: {plain.error}")
        elif m is not None:
            print(
                f"{where}: {m.kind} at response position {m.position}: plain {m.plain_token} "
                f"(p={m.plain_prob:.4g}) vs speculative {m.spec_token} (p={m.spec_prob:.4g}), "
                f"perturbed logit {m.gap:.3g} below the best"
            )
        elif item.is_bug():
            ended = "" if item.finish_equal else f"; plain ended {_ending(plain)}, speculative ended {_ending(spec)}"
            print(f"{where}: bug: equal tokens{ended}; max |logprob diff| {item.logprob_diff:.3g}")
        elif item.near_tie:
            print(
                f"{where}: near-tie: equal tokens; max |logprob diff| {item.logprob_diff:.3g}, where a top-k / top-p "
                "edge within rounding moved the normaliser"
            )
        elif same_error:
            ended_alike += 1  # e.g. non-finite logits: the same tokens, then the same error, in both runs
            print(f"{where}: equal, both runs ended it with the same error: {plain.error}")
    notes = [f"{refused} of them refused by both runs, not checked"] if refused else []
    notes += [f"{ended_alike} of them ended by the same error in both runs"] if ended_alike else []
    verified = [s for s in engine.round_stats if not s.strategy.is_disabled]  # the speculative engine's rounds
    drafted = sum(sum(s.drafted_tokens) for s in verified)
    notes.append(f"{len(verified)} speculative rounds, {drafted} drafted tokens verified")
    print(f"check-exact {cfg.strategy} ({cfg.dtype}): {report.summary()}" + "".join(f" ({n})" for n in notes))
    if "report" in targets:
        doc = report.to_dict() | {"speculative_rounds": len(verified), "drafted_tokens": drafted}
        write_text(targets["report"], json.dumps(doc, indent=1, allow_nan=False) + "\n")  # a FIFO too
    if not verified and not report.bugs:  # equal tokens prove nothing when every round was plain (a bug, though,
        # is one: plain decoding differing between the two runs' batches is said as a bug, exit 1)
        raise ValueError(
            f"no speculative round ran under strategy={cfg.strategy} (its selector chose plain decoding, "
            "or no request decoded past its first token): nothing was checked; give more max_new_tokens, or a "
            "strategy that speculates at this batch size"
        )
    return report


def _ending(output: RequestOutput) -> str:
    """How a request ended, for a line of the report: its finish reason, and its error when it has one."""
    reason = output.finish_reason.value if output.finish_reason is not None else "unfinished"
    return reason + (f" ({output.error})" if output.error else "")


def check_exact_exit_code(report: ExactnessReport) -> int:
    """0 when no request shows a bug (near-ties allowed), else EXIT_BUG."""
    if report.bugs:
        print(f"check-exact: {len(report.bugs)} request(s) differ beyond a float tie", file=sys.stderr)
        return EXIT_BUG
    return 0
