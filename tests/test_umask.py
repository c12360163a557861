"""The umask read without setting it: setting it to 0 to read it gave other threads' new files mode 0666 for a
moment (a co-training thread writing while another saved a drafter)."""

from __future__ import annotations

import os

import pytest

from fastrl.atomic_files import current_umask


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_the_umask_is_read_without_ever_changing_it(monkeypatch):
    before = os.umask(0o027)
    try:
        calls: list[int] = []
        umask = os.umask

        def recorded(mask: int) -> int:
            calls.append(mask)
            return umask(mask)

        monkeypatch.setattr(os, "umask", recorded)
        assert current_umask() == 0o027
        assert calls == []
    finally:
        os.umask(before)
