"""`fastrl export-drafter DIR OUT bandit_state=FILE` refuses a state learned with another drafter, as `fastrl generate`
does: the drafter is the part of a state's setting the export knows (the policy it will serve and the dtype the
state's rounds ran in are not the export's), so that part alone is compared."""

from __future__ import annotations

import json

from fastrl.cli import main
from tests.helpers import write_last_layer_drafter


def test_a_state_of_another_drafter_is_refused_naming_both(tmp_path, capsys):
    drafter = write_last_layer_drafter(tmp_path / "drafter")
    prompts, state = tmp_path / "in.jsonl", tmp_path / "bandit.json"
    prompts.write_text(json.dumps({"prompt": "sum a=20 b=51 ="}) + "\n")
    bandit = ["strategy=bandit", "bandit.strategies=[3_1_4,disable]", "bandit.calibrate=false"]
    args = [f"prompts={prompts}", f"output={tmp_path / 'o.jsonl'}", f"drafter={drafter}", f"bandit_state={state}"]
    assert main(["generate", *args, *bandit, "max_new_tokens=8", "progress=false"]) == 0
    learned = json.loads(state.read_text())
    setting = learned["setting"]
    assert main(["export-drafter", str(drafter), str(tmp_path / "a"), f"bandit_state={state}"]) == 0
    assert (tmp_path / "a" / "bandit_winners.json").is_file()
    # the policy and the dtype are not the export's to know: a state of another policy or dtype is taken
    state.write_text(json.dumps(learned | {"setting": setting | {"policy": "0" * 16, "dtype": "float64"}}))
    assert main(["export-drafter", str(drafter), str(tmp_path / "b"), f"bandit_state={state}"]) == 0
    content = json.dumps(learned | {"setting": setting | {"drafter": "1" * 16}})
    state.write_text(content)
    capsys.readouterr()
    assert main(["export-drafter", str(drafter), str(tmp_path / "c"), f"bandit_state={state}"]) == 2
    err = capsys.readouterr().err
    assert (
        f"bandit_state={state} was learned with another drafter (weights {'1' * 16} there, weights "
        f"{setting['drafter']} here): its acceptance and round times do not fit the drafter {drafter}"
    ) in err
    assert "Traceback" not in err and not (tmp_path / "c").exists() and state.read_text() == content
