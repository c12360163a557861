"""The suite's test groups reach pytest-xdist: under `-n 2 --dist loadgroup` (the README's test command) every test id
carries its group (`id@group`), so a module's tests, or tests/rollout's, share their fixtures on one worker. pytest
9.2 silently broke this (pytest-dev/pytest-xdist#1386): the suite then built shared fixtures twice and a test that
reads what an earlier one left failed; this says so at once instead."""

from __future__ import annotations

import pytest


def test_the_groups_reach_xdist(request):
    if not hasattr(request.config, "workerinput"):
        pytest.skip("not run under pytest-xdist")
    assert request.node.nodeid.endswith("@tests/test_xdist_groups.py"), (
        f"{request.node.nodeid}: pytest-xdist ignored the test groups (pytest {pytest.__version__}; see pyproject's "
        "dev extra)"
    )
