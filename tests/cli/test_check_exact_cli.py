"""`fastrl check-exact` on the bundled model: the sampler-filter reproduction of the tree-selection bug is clean,
the report is valid JSON, and bad keys are one clear error."""

from __future__ import annotations

import json

import torch

from fastrl.cli import main
from tests.helpers import make_hf_model

# The reproduction of the top-p tree bug (request 2 emitted EOS at position 14, outside the filtered support).
PROMPTS = ["6239+77=", "30+18=", "5+401676=", "89694+564794=", "10+3269=", "9641+48=", "3484+60="]


def test_check_exact_reproduction_is_clean(tmp_path, capsys):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "seed": 1000 + i}) + "\n" for i, p in enumerate(PROMPTS)))
    report = tmp_path / "report.json"
    args = [f"prompts={prompts}", f"report={report}", "max_new_tokens=96", "batch_size=5", "plain_batch_size=2"]
    code = main(["check-exact", *args, "temperature=1.0", "top_p=0.8", "strategy=4_3_10", "progress=false"])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(report.read_text())
    assert data["requests"] == len(PROMPTS) and data["identical"] == len(PROMPTS) and data["bugs"] == 0
    assert "7 requests: 7 identical, 0 near-ties, 0 bugs" in out
    assert data["speculative_rounds"] > 0 and f"({data['speculative_rounds']} speculative rounds, " in out


def test_a_check_where_no_speculative_round_ran_fails(tmp_path, capsys):
    """Plain rounds only (one new token: no decode round; a bandit whose threshold sends every round to plain)
    reported "2 identical, 0 bugs" with exit 0: a check that checked nothing."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "1+2="}\n{"prompt": "3+4="}\n')
    base = ["check-exact", f"prompts={prompts}", "progress=false"]
    for args in (["strategy=7_1_8", "max_new_tokens=1"], ["strategy=bandit", "max_new_tokens=1"]):
        assert main([*base, *args, "plain_batch_size=2"]) == 2, args
        captured = capsys.readouterr()
        assert "(0 speculative rounds, 0 drafted tokens verified)" in captured.out
        assert "no speculative round ran" in captured.err


def test_check_exact_rejects_disable_and_unknown_keys(tmp_path, capsys):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "1+2="}\n')
    for plain in (
        ["strategy=disable"],
        ["strategy=DISABLE"],
        ["strategy=bandit", "bandit.strategies=[disable]"],
        ["strategy=bandit", "bandit.bucket_strategies={1:[disable]}", "batch_size=1"],
        ["strategy=bandit", "bandit.bs_threshold=1", "bandit.bucket_strategies={1:[disable]}", "batch_size=4"],
    ):
        assert main(["check-exact", f"prompts={prompts}", *plain]) == 2  # plain against plain checks nothing
        assert "this one decodes plainly only" in capsys.readouterr().err, plain
    assert main(["check-exact", f"prompts={prompts}", "strategy=9_9"]) == 2
    assert "9_9" in capsys.readouterr().err


def test_check_exact_groups_with_a_hybrid_arm(tmp_path, capsys):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:3]))
    report = tmp_path / "report.json"
    args = [f"prompts={prompts}", f"report={report}", "max_new_tokens=48", "n=3", "temperature=1.0"]
    code = main(["check-exact", *args, "strategy=3_1_4+suffix_8", "progress=false"])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(report.read_text())
    assert data["requests"] == 9 and data["identical"] == 9


def test_half_precision_log_probs_are_judged_by_their_dtype(tmp_path, capsys):
    """bfloat16 and float16 runs round a verify row's log-probs apart from a plain row's (tokens equal): by default
    the dtype's tolerance judges them (no bug, exit 0); a float32-sized tolerance asked for still reports them."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:4]))
    args = [f"prompts={prompts}", "max_new_tokens=48", "temperature=1.0", "strategy=3_1_4", "progress=false"]
    for dtype in ("bfloat16", "float16"):
        report = tmp_path / f"{dtype}.json"
        code = main(["check-exact", *args, f"dtype={dtype}", f"report={report}"])
        out = capsys.readouterr().out
        data = json.loads(report.read_text())
        assert code == 0 and data["bugs"] == 0 and data["near_ties"] + data["identical"] == 4, out
        assert data["logprob_tol"] == {"bfloat16": 0.25, "float16": 0.05}[dtype]
    strict = tmp_path / "strict.json"
    assert main(["check-exact", *args, "dtype=bfloat16", "logprob_tol=1e-4", f"report={strict}"]) == 1
    out = capsys.readouterr().out
    assert "bug: equal tokens" in out and json.loads(strict.read_text())["logprob_tol"] == 1e-4


def test_a_prompt_past_the_context_is_refused_before_any_work(tmp_path, capsys):
    """A prompt past the model's context is refused naming its line before any decoding, as `generate` refuses it
    (both engines used to refuse it mid-run, and the report said "not checked, both runs refused it")."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+2="}) + "\n" + json.dumps({"prompt_ids": [5] * 1100}) + "\n")
    assert main(["check-exact", f"prompts={prompts}", "max_new_tokens=8", "strategy=3_1_4", "progress=false"]) == 2
    said = capsys.readouterr()
    assert f"{prompts}:2: prompt has 1100 tokens; the context length is 1024" in said.err and said.out == ""


def test_rows_both_runs_end_on_the_same_error_are_compared_and_said(tmp_path, capsys):
    """A model whose logits overflow float32 (finite weights) ends every request on non-finite logits after its
    first token in both runs: compared (equal tokens, then the same error), said per line, a strict-JSON report;
    and since no speculative round ran, the check says it checked no speculation (exit 2)."""
    model = make_hf_model("llama")
    with torch.no_grad():
        model.model.norm.weight.fill_(3e38)
    model.save_pretrained(tmp_path / "overflow")
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in ([5, 6, 7], [8, 9])))
    report = tmp_path / "report.json"
    args = [f"prompts={prompts}", f"report={report}", "max_new_tokens=8", f"model={tmp_path / 'overflow'}"]
    assert main(["check-exact", *args, "strategy=suffix_8", "progress=false"]) == 2
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert "no speculative round ran under strategy=suffix_8" in captured.err
    assert (
        out[0]
        == "line 1: equal, both runs ended it with the same error: request 1: non-finite logits at generated token 0"
    )
    assert out[-1].endswith(
        "2 requests: 2 identical, 0 near-ties, 0 bugs; max |logprob diff| 0.00e+00 "
        "(2 of them ended by the same error in both runs) (0 speculative rounds, 0 drafted tokens verified)"
    )
    assert json.loads(report.read_text())["identical"] == 2


def test_a_report_fifo_is_written_through_and_bad_paths_and_tolerances_are_named(tmp_path, capsys):
    """report= a FIFO was replaced by a regular file (its reader got nothing); a prompts pipe was "not found";
    logprob_tol=inf turned the log-prob check off silently."""
    import os
    import threading

    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "1+2="}\n')
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    args = ["check-exact", f"prompts={prompts}", "strategy=3_1_4", "max_new_tokens=4", "progress=false"]
    assert main([*args, f"report={fifo}"]) == 0
    reader.join(timeout=60)
    assert json.loads(got[0])["requests"] == 1 and fifo.is_fifo()
    capsys.readouterr()
    pipe = tmp_path / "prompts.fifo"
    os.mkfifo(pipe)
    assert main(["check-exact", f"prompts={pipe}", "max_new_tokens=4"]) == 2
    assert f"prompts file {pipe} is not a regular file (a pipe or a device)" in capsys.readouterr().err
    assert main([*args, "logprob_tol=inf"]) == 2
    assert "check_exact.logprob_tol must be a finite number >= 0" in capsys.readouterr().err


def test_a_bug_found_where_no_speculative_round_ran_is_still_a_bug(tmp_path, capsys, monkeypatch):
    """Plain decoding that differs between the two runs' batches is a bug (exit 1), said as one, not "nothing was
    checked" (exit 2). The speculative run's first token is flipped to stand in for such a difference."""
    import fastrl.commands.check_exact as check_exact

    compare = check_exact.compare_runs

    def flipped(model, inputs, plain, spec, tol):
        spec[0].token_ids[0] = (spec[0].token_ids[0] + 1) % model.config.vocab_size
        return compare(model, inputs, plain, spec, tol)

    monkeypatch.setattr(check_exact, "compare_runs", flipped)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "1+2="}\n')
    assert main(["check-exact", f"prompts={prompts}", "progress=false", "strategy=7_1_8", "max_new_tokens=1"]) == 1
    captured = capsys.readouterr()
    assert "1 bugs" in captured.out and "no speculative round ran" not in captured.err
