"""Shared test configuration: GPU tests skipped without CUDA; each test gets the root logger it found; without CUDA,
Triton kernels run in Triton's interpreter; Ctrl-C is Python's KeyboardInterrupt even when the suite was started
with SIGINT ignored."""

import os
import signal

import pytest
import torch


def pytest_configure(config):
    # A shell without job control starts `cmd &` with SIGINT ignored, and children inherit that: the tests of
    # Ctrl-C (step boundaries, train's interrupt checkpoint in a subprocess) then met no interrupt. Python's own
    # handler here (in every xdist worker too) also resets the disposition a subprocess inherits to the default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if not torch.cuda.is_available():  # read when Triton is imported: its kernels then run on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests run tiny models on a 2-core machine: one intra-op thread avoids thread hand-off costs per small op.
torch.set_num_threads(1)


# Packages whose tests share package-scoped fixtures (tests/rollout: a checkpoint and one local Ray cluster).
SHARED_FIXTURE_PACKAGES = ("tests/rollout/",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (`-n 2 --dist loadgroup`, the README's test command) each group runs on one worker: a module
    # (or a package above) builds its module-scoped fixtures (a trained drafter, a verl stack, a Ray cluster) once.
    # First among the hooks: xdist's worker names each test by its group in its own hook, reading these marks.
    root = config.rootpath
    shared = {}
    for item in items:
        module = item.path.relative_to(root).as_posix()
        group = next((p for p in SHARED_FIXTURE_PACKAGES if module.startswith(p)), module)
        item.add_marker(pytest.mark.xdist_group(group))
        shared[item] = group != module
    # The packages' groups (the longest: one Ray cluster's tests in a row) go first, so the other worker takes the
    # modules meanwhile instead of idling while one runs last.
    items.sort(key=lambda item: not shared[item])
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_root_logging():
    """Hydra's main (run by in-process CLI tests) configures the root logger with handlers bound to the stderr of
    the test that ran it; a process runs one command, a test session many: give each test the root logger it found."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory):
    """A saved tiny random policy with the character tokenizer (the `fastrl train model=DIR` tests' model)."""
    from fastrl.models.checkpoint import save_model
    from tests.rl.grpo_setup import char_tokenizer, tiny_policy

    path = tmp_path_factory.mktemp("policy")
    save_model(tiny_policy(), path)
    char_tokenizer().save_pretrained(path)
    return path
