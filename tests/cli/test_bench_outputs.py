"""`fastrl bench` writes where it said, keeps what finished, and refuses before any work what it cannot do: the
output through a symlink (never replacing the link), the long-tail side files guarded as outputs, the finished
suites kept when a later one fails or is interrupted, one output per job of a multirun."""

from __future__ import annotations

import json

import pytest

from fastrl.cli import main
from fastrl.commands import bench

TINY = ["suites=[prefix_sharing]", "prefix_sharing_prompts=1", "prefix_sharing_group_sizes=[1]", "repeats=1"]


def test_a_symlinked_output_is_written_through(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "target.json").write_text('{"old": 1}')
    link = tmp_path / "link.json"
    link.symlink_to(real / "target.json")
    assert main(["bench", f"output={link}", *TINY]) == 0
    assert link.is_symlink()
    payload = json.loads((real / "target.json").read_text())
    assert payload["suites"] == ["prefix_sharing"] and "incomplete" not in payload
    assert [r["samples_per_prompt"] for r in payload["prefix_sharing"]] == [1]


def test_the_finished_suites_are_kept_when_a_later_one_stops_the_run(tmp_path, monkeypatch, capsys):
    def interrupted(ctx, payload):
        raise KeyboardInterrupt

    monkeypatch.setitem(bench.SUITE_RUNS, "host_time", interrupted)
    out = tmp_path / "b.json"
    assert main(["bench", f"output={out}", *TINY, "suites=[prefix_sharing,host_time]"]) == 130
    payload = json.loads(out.read_text())
    assert payload["suites"] == ["prefix_sharing", "host_time"] and "prefix_sharing" in payload
    assert payload["incomplete"] == "finished ['prefix_sharing']; stopped: interrupted"
    assert f"the finished suites ['prefix_sharing'] are in {out}" in capsys.readouterr().err


def test_the_long_tail_side_files_are_named_after_their_output(tmp_path):
    """The round costs and the selectors' stats are named after the output: two outputs in one directory each keep
    their own (both runs wrote round_costs.json there, the second over the first's)."""
    args = ["bench", f"output={tmp_path / 'b.json'}", "suites=[long_tail]", "long_tail_requests=2"]
    assert main([*args, "long_tail_max_new_tokens=4", "long_tail_selectors=[disable,3_1_4]"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "b.round_costs.json"]
    names = {}
    for output in ("b.json", "c.json"):
        files = bench.output_files(bench.BenchConfig(output=str(tmp_path / output), suites=["long_tail"]))
        names[output] = {k: v.rsplit("/", 1)[-1] for k, v in files.items()}
    assert names["b.json"] == {
        "output": "b.json",
        "round_costs": "b.round_costs.json",
        "long_tail_bandit": "b.long_tail_bandit.json",
        "long_tail_bandit_plot": "b.long_tail_bandit.png",
        "long_tail_ema": "b.long_tail_ema.json",
        "long_tail_ema_plot": "b.long_tail_ema.png",
    }
    assert not set(names["b.json"].values()) & set(names["c.json"].values())


def test_each_job_of_a_multirun_writes_its_own_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Hydra records the sweep under runs/multirun/ here
    out = tmp_path / "b.json"
    assert main(["bench", "-m", f"output={out}", *TINY, "prefix_sharing_prompts=1,2"]) == 0
    prompts = [json.loads((tmp_path / f"b.job{j}.json").read_text())["prefix_sharing"][0] for j in (0, 1)]
    assert prompts[0]["prompt_tokens"] < prompts[1]["prompt_tokens"]  # job 1 ran two prompts, job 0 one
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["output="], "bench.output must be a file path"),
        (["threads=-1"], "bench.threads must be an integer >= 0"),
        (["device=gpu"], "bench.device='gpu' is not a torch device"),
        (["bs1_strategies=[suffix_8]"], "bench.bs1_strategies: suffix_8 is not an EAGLE tree"),
        (["long_tail_selectors=[bandit:foo=1]"], "bench.long_tail_selectors: selector 'bandit:foo=1'"),
        (["suites=[plain_vs_hf]", "new_tokens=5000"], "bench.new_tokens=5000: the longest prompt leaves room for"),
        # sizes whose KV caches cannot fit: they ran for minutes, growing (10**9 rows: a list of prompts first)
        (["suites=[plain_vs_hf]", "batch_sizes=[1000000000]"], "bench.batch_sizes=1000000000 needs a"),
        (["suites=[long_tail]", "long_tail_requests=100000000"], "bench.long_tail_requests=100000000 needs a"),
        (
            ["suites=[prefix_sharing]", "prefix_sharing_prompts=3", "prefix_sharing_group_sizes=[2,100000000]"],
            "bench.prefix_sharing_prompts x max(bench.prefix_sharing_group_sizes)=300000000 needs a",
        ),
        (["suites=[kv_memory]", "kv_memory_requests=1000000000"], "bench.kv_memory_requests=1000000000 needs a"),
        # the suite's child process refused it, and the suite ended in a CalledProcessError traceback
        (
            ["suites=[kv_memory]", "kv_memory_new_tokens=[73,1024]"],
            "bench.kv_memory_new_tokens=[73, 1024]: 1024 leaves no room for a prompt in the model's 1024 positions",
        ),
        # requests that are not whole groups: the header named a group size the run did not have
        (
            ["suites=[long_tail]", "long_tail_requests=2", "long_tail_group_size=5"],
            "bench.long_tail_requests=2 must be a multiple of bench.long_tail_group_size=5",
        ),
    ],
)
def test_bad_values_are_one_line_before_any_suite_runs(tmp_path, capsys, args, said):
    out = tmp_path / "b.json"
    assert main(["bench", f"output={out}", *args]) == 2
    assert said in capsys.readouterr().err and not out.exists()
