"""`json_values.read_json`: the one reader of small JSON files, with one error per way a file can be wrong."""

from __future__ import annotations

import os

import pytest

from fastrl.json_values import read_json


def test_reads_a_value(tmp_path):
    file = tmp_path / "a.json"
    file.write_text('{"x": [1, 2.5, null]}', encoding="utf-8")
    assert read_json(file) == {"x": [1, 2.5, None]}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda f: None, "is missing"),
        (lambda f: f.write_text("{", encoding="utf-8"), "is not valid JSON"),
        (lambda f: f.write_bytes(b"\xff\xfe{}"), "is not valid JSON"),
        (lambda f: f.mkdir(), "is a directory"),
    ],
)
def test_bad_files_name_the_label(tmp_path, make, message):
    file = tmp_path / "state.json"
    make(file)
    with pytest.raises(ValueError, match=f"^{file} {message}"):
        read_json(file)
    with pytest.raises(ValueError, match=f"^bandit_state=x.json {message}"):
        read_json(file, "bandit_state=x.json")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    file = tmp_path / "locked.json"
    file.write_text("{}", encoding="utf-8")
    file.chmod(0)
    with pytest.raises(ValueError, match="cannot be read"):
        read_json(file)
