"""Named-model resolution (`model=smollm2`) without the real package: errors, the cache and the shipped drafter."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from fastrl.commands.engine_setup import resolve_model_dir
from fastrl.models import named
from fastrl.models.named import MARKER_FILE, SMOLLM2, cache_root, named_model_dir, shipped_drafter_dir


def test_missing_package_is_an_import_error_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(named.importlib.util, "find_spec", lambda n: None if n == SMOLLM2.package else real(n))
    with pytest.raises(ImportError, match=r'model=smollm2: .*pip install -e "\.\[smollm2\]"'):
        resolve_model_dir("smollm2")


def test_unknown_name_is_a_value_error():
    with pytest.raises(ValueError, match="not a named model"):
        named_model_dir("no-such-model")


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTRL_CACHE", str(tmp_path))
    assert cache_root() == tmp_path


def test_conversion_runs_once_into_the_cache_atomically(monkeypatch, tmp_path):
    gguf = tmp_path / "pkg" / SMOLLM2.gguf_file
    gguf.parent.mkdir()
    gguf.write_bytes(b"")
    calls: list[Path] = []

    def fake_convert(spec, source, out):
        assert out.name.startswith(".") and out.parent == tmp_path / "cache" / "models"  # a tmp dir beside the target
        calls.append(source)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"")
        (out / "model.safetensors").chmod(0o600)  # as safetensors creates its files

    monkeypatch.setattr(named, "gguf_path", lambda spec: gguf)
    monkeypatch.setattr(named.importlib.metadata, "version", lambda dist: "9.9")
    monkeypatch.setattr(named.importlib.util, "find_spec", lambda n: object())
    monkeypatch.setattr(named, "convert_gguf", fake_convert)
    umask = os.umask(0o022)
    try:
        first = named_model_dir("smollm2", tmp_path / "cache")
    finally:
        os.umask(umask)
    umask = 0o022
    second = named_model_dir("smollm2", tmp_path / "cache")
    assert first == second == tmp_path / "cache" / "models" / "smollm2-9.9" and calls == [gguf]
    assert sorted(p.name for p in first.parent.iterdir()) == ["smollm2-9.9"]  # no tmp dir left behind
    assert json.loads((first / MARKER_FILE).read_text())["name"] == "smollm2"
    # readable by the other users of a shared cache: the directory came from mkdtemp (0700), the weights 0600
    assert first.stat().st_mode & 0o777 == 0o777 & ~umask
    assert {f.name: f.stat().st_mode & 0o777 for f in first.iterdir()} == dict.fromkeys(
        ["config.json", "model.safetensors", MARKER_FILE], 0o666 & ~umask
    )


def test_failed_conversion_leaves_no_cache_entry(monkeypatch, tmp_path):
    def broken(spec, source, out):
        (out / "partial").write_text("x")
        raise RuntimeError("boom")

    monkeypatch.setattr(named, "gguf_path", lambda spec: tmp_path / "x.gguf")
    monkeypatch.setattr(named.importlib.metadata, "version", lambda dist: "9.9")
    monkeypatch.setattr(named.importlib.util, "find_spec", lambda n: object())
    monkeypatch.setattr(named, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="boom"):
        named_model_dir("smollm2", tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


def test_shipped_drafter_follows_the_marker(tmp_path):
    model_dir, assets = tmp_path / "m", tmp_path / "assets"
    model_dir.mkdir()
    (assets / SMOLLM2.drafter_asset).mkdir(parents=True)
    assert shipped_drafter_dir(model_dir, assets) is None  # a plain directory has no shipped drafter
    (model_dir / MARKER_FILE).write_text(json.dumps({"name": "smollm2"}))
    assert shipped_drafter_dir(model_dir, assets) == assets / SMOLLM2.drafter_asset


def test_a_conversion_of_an_older_revision_is_converted_again(monkeypatch, tmp_path):
    """A cache converted before the current revision (its tokenizer built otherwise) is replaced, once."""
    gguf = tmp_path / "pkg" / SMOLLM2.gguf_file
    gguf.parent.mkdir()
    gguf.write_bytes(b"")
    target = tmp_path / "cache" / "models" / "smollm2-9.9"
    target.mkdir(parents=True)
    (target / MARKER_FILE).write_text(json.dumps({"name": "smollm2", "source": gguf.name, "version": "9.9"}))
    (target / "stale.json").write_text("{}")
    calls: list[Path] = []

    def fake_convert(spec, source, out):
        calls.append(source)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(named, "gguf_path", lambda spec: gguf)
    monkeypatch.setattr(named.importlib.metadata, "version", lambda dist: "9.9")
    monkeypatch.setattr(named.importlib.util, "find_spec", lambda n: object())
    monkeypatch.setattr(named, "convert_gguf", fake_convert)
    assert named_model_dir("smollm2", tmp_path / "cache") == target
    assert named_model_dir("smollm2", tmp_path / "cache") == target and calls == [gguf]  # converted once
    assert sorted(p.name for p in target.iterdir()) == ["config.json", MARKER_FILE]  # the old one's files gone
    assert json.loads((target / MARKER_FILE).read_text())["revision"] == named.CONVERSION_REVISION
    assert sorted(p.name for p in target.parent.iterdir()) == ["smollm2-9.9"]  # nothing set aside is left
