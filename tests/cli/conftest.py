"""Fixtures of the command-line tests."""

import pytest

from tests.helpers import make_hf_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A saved tiny random HF Llama (the `fastrl generate model=DIR` tests' model); tests only read it."""
    path = tmp_path_factory.mktemp("tiny")
    make_hf_model("llama").save_pretrained(path)
    return path
