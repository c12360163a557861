"""`fastrl generate bandit_state=FILE`: a run starts from the bandit state an earlier run saved there and saves its
own; tokens never depend on it; a file that is not a bandit state is one clear error and is left as it was."""

from __future__ import annotations

import json

import pytest

from fastrl.adaptive.bandit_state_check import STATE_VERSION
from fastrl.cli import main

PROMPTS = ["sum a=20 b=51 =", "sum a=10 b=69 c=13 =", "sum a=65 b=28 =", "sum a=3 b=94 c=12 d=7 ="]
BANDIT = ["strategy=bandit", "bandit.strategies=[5_1_6,3_1_4,disable]", "bandit.calibrate=false"]


def _run(tmp_path, name: str, *extra: str) -> list[list[int]]:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / f"{name}.jsonl"
    args = [f"prompts={prompts}", f"output={out}", "max_new_tokens=24", "temperature=1.0", "seed=3", "batch_size=1"]
    assert main(["generate", *args, "progress=false", *extra]) == 0
    return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]


def _trials(path) -> float:
    return sum(sum(trials) for _, trials in json.loads(path.read_text())["acceptance"].values())


def test_a_run_starts_from_the_state_the_last_one_saved(tmp_path):
    state, fresh = tmp_path / "bandit.json", tmp_path / "fresh.json"
    plain = _run(tmp_path, "plain")
    assert _run(tmp_path, "first", *BANDIT, f"bandit_state={state}") == plain
    saved = json.loads(state.read_text())
    assert saved["version"] == STATE_VERSION and _trials(state) > 0
    assert _run(tmp_path, "second", *BANDIT, f"bandit_state={state}") == plain  # warm
    assert _run(tmp_path, "cold", *BANDIT, f"bandit_state={fresh}") == plain  # the same prompts, cold
    # the warm run's counts hold the first run's rows besides its own: more than a cold run over the same prompts
    assert _trials(state) > _trials(fresh)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not a bandit state JSON"),
        (json.dumps({"version": 1, "acceptance": {}}), "version 1"),
        (  # a train checkpoint's rollout_selector.json: it said "bandit state version None != 4"
            json.dumps({"workers": [{"version": 4}], "affinity": []}),
            "the per-worker selector states of a `fastrl train` checkpoint",
        ),
        # these said "bandit state version None != 4 (version 3 held ...)", or "version '4' != 4"
        ("[1, 2]", "not a bandit state: expected a JSON object, got an array"),
        (json.dumps({"version": "4"}), 'bandit state "version" is "4", a string: expected the integer 4'),
    ],
)
def test_a_file_that_is_no_bandit_state_is_named_and_kept(tmp_path, capsys, content, message):
    state = tmp_path / "bandit.json"
    state.write_text(content)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n")
    args = [f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", *BANDIT, f"bandit_state={state}"]
    assert main(["generate", *args, "progress=false"]) == 2
    err = capsys.readouterr().err
    assert "bandit_state" in err and message in err and "Traceback" not in err
    assert state.read_text() == content
    assert not (tmp_path / "o.jsonl").exists()


def test_bandit_state_needs_the_bandit(tmp_path, capsys):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n")
    args = [f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", f"bandit_state={tmp_path / 'b.json'}"]
    assert main(["generate", *args]) == 2
    assert "strategy=bandit" in capsys.readouterr().err


def _damaged(state: dict, key: str, value) -> dict:
    if key == "acceptance-counts":
        return state | {
            "acceptance": {arm: [[-5.0] * len(h), [-1.0] * len(t)] for arm, (h, t) in state["acceptance"].items()}
        }
    return state | {key: value}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("acceptance", "x"),
        ("acceptance", [1, 2]),
        ("acceptance-counts", None),
        ("times", "x"),
        ("times", {}),
        ("chain_rounds", [1]),
        ("calibration", [["disable", 1]]),
        ("calibration", [["nope", 1, 0.1]]),
        ("chain_rounds", {"12_1_13@0.3": {"0": "x"}}),
        ("chain_rounds", {"12_1_13@0.3": {"3": [0.0, 1.0, 5.0]}}),  # a depth below one level: a math domain error
    ],
)
def test_a_damaged_state_is_one_error_before_any_work(tmp_path, capsys, key, value):
    """Contents a bandit cannot use (wrong types, negative counts, a calibration row without its time) are refused
    when the file is read, before any work, naming it: they were tracebacks after the model loaded and calibrated."""
    from fastrl.adaptive.bandit import BanditSelector
    from fastrl.adaptive.bandit_config import BanditConfig

    config = BanditConfig(strategies=["12_1_13@0.3", "5_1_6", "3_1_4", "disable"], calibrate=False)
    good = BanditSelector(config).state_dict()
    good["acceptance"] = {arm: [[1.0] * len(h), [2.0] * len(t)] for arm, (h, t) in good["acceptance"].items()}
    state = tmp_path / "bandit.json"
    content = json.dumps(_damaged(good, key, value))
    state.write_text(content)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n")
    args = [f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", "strategy=bandit", f"bandit_state={state}"]
    assert main(["generate", *args, "progress=false"]) == 2
    err = capsys.readouterr().err
    assert f"bandit_state={state}: a damaged bandit state" in err and "Traceback" not in err, err
    assert state.read_text() == content


def test_a_state_learned_with_another_dtype_or_drafter_is_refused_and_kept(tmp_path, capsys, monkeypatch):
    """Acceptance belongs to one policy and drafter: a state saved by a float32 run is refused by a float64 run,
    and by a run with another drafter, naming both settings, before the model is loaded (the drafter's fingerprint
    comes from its files); one learned with another policy once the policy is loaded, before the engine is built
    and calibrated (all three were refused after the calibration). The file is left as it was."""
    from fastrl.commands import generate
    from tests.helpers import write_last_layer_drafter

    state = tmp_path / "bandit.json"
    _run(tmp_path, "first", *BANDIT, f"bandit_state={state}")
    saved = state.read_text()
    setting = json.loads(saved)["setting"]
    assert setting["dtype"] == "float32"
    capsys.readouterr()
    calls = []
    for name in ("load_model", "build_engine"):
        monkeypatch.setattr(generate, name, _recorded(calls, name, getattr(generate, name)))
    prompts = tmp_path / "in.jsonl"
    args = [f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", *BANDIT, f"bandit_state={state}", "progress=false"]
    assert main(["generate", *args, "dtype=float64"]) == 2
    err = capsys.readouterr().err
    assert f"{state} was learned with another dtype (float32 there, float64 here): its" in err
    assert "Traceback" not in err
    other = write_last_layer_drafter(tmp_path / "other_drafter")
    assert main(["generate", *args, f"drafter={other}"]) == 2
    err = capsys.readouterr().err
    assert f"{state} was learned with another drafter (weights {setting['drafter']} there, weights " in err
    assert calls == [] and state.read_text() == saved and not (tmp_path / "o.jsonl").exists()
    state.write_text(json.dumps(json.loads(saved) | {"setting": setting | {"policy": "0" * 16}}))
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err
    assert (
        f"{state} was learned with another policy (weights {'0' * 16} there, weights {setting['policy']} here)" in err
    )
    assert calls == ["load_model"] and not (tmp_path / "o.jsonl").exists()


def _recorded(calls: list, name: str, function):
    def call(*args, **kwargs):
        calls.append(name)
        return function(*args, **kwargs)

    return call


def test_a_run_keeps_its_own_calibration_over_the_states(tmp_path):
    """The state's calibration was measured at its run's batch sizes; a warm run with a larger batch calibrates
    its own sizes and keeps them (it extrapolated from the state's before)."""
    state = tmp_path / "bandit.json"
    calibrated = ["strategy=bandit", "bandit.strategies=[3_1_4,disable]"]
    _run(tmp_path, "first", *calibrated, f"bandit_state={state}")
    sizes = {b for _, b, *_ in json.loads(state.read_text())["calibration"]}
    prompts = tmp_path / "in.jsonl"
    args = [f"prompts={prompts}", f"output={tmp_path / 'wide.jsonl'}", "max_new_tokens=8", "batch_size=4"]
    assert main(["generate", *args, *calibrated, f"bandit_state={state}", "progress=false"]) == 0
    wider = {b for _, b, *_ in json.loads(state.read_text())["calibration"]}
    assert sizes == {1} and max(wider) == 4


def test_a_run_with_fewer_arms_keeps_the_others_learning_in_the_file(tmp_path):
    """A run with a subset of the arms rewrote the file with its own alone: 5_1_6's counts were lost, and the next
    run with it explored it again."""
    state = tmp_path / "bandit.json"
    _run(tmp_path, "first", *BANDIT, f"bandit_state={state}")
    first = json.loads(state.read_text())["acceptance"]
    fewer = ["strategy=bandit", "bandit.strategies=[3_1_4,disable]", "bandit.calibrate=false"]
    _run(tmp_path, "second", *fewer, f"bandit_state={state}")
    second = json.loads(state.read_text())
    assert second["acceptance"]["5_1_6"] == first["5_1_6"]  # carried as it was
    assert sum(second["acceptance"]["3_1_4"][1]) > sum(first["3_1_4"][1])  # learned on
    assert second["config"]["strategies"] == ["3_1_4", "disable"]
    _run(tmp_path, "third", *BANDIT, f"bandit_state={state}")  # the file still loads into the wider bandit
