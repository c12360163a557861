"""The heap settled while decoding: start-up's objects frozen out of the cyclic collector's way, and given back."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest

from fastrl.engine.heap import settled_heap


class _Cycle:
    """An object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_settled_heap_freezes_for_its_block_and_gives_the_heap_back():
    assert gc.get_freeze_count() == 0
    before = _Cycle()
    before_ref = weakref.ref(before)
    with settled_heap() as frozen:
        assert frozen > 0 and gc.get_freeze_count() > 0
        del before
        gc.collect()
        assert before_ref() is not None  # frozen: a full collection passes it by while the block runs
        during = _Cycle()
        during_ref = weakref.ref(during)
        del during
        gc.collect()
        assert during_ref() is None  # what decoding drops in cycles is still collected
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert before_ref() is None  # the cycle frozen in the block is freed once the heap is given back


def test_settled_heap_gives_the_heap_back_on_an_error():
    with pytest.raises(RuntimeError, match="stop"), settled_heap():
        raise RuntimeError("stop")
    assert gc.get_freeze_count() == 0


def test_a_settled_process_gives_its_heap_back_at_exit():
    code = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count()))  # runs after the hooks registered later\n"
        "from fastrl.engine.heap import settle_heap\n"
        "settle_heap()\n"
        "print('settled', gc.get_freeze_count() > 0, settle_heap() > 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["settled True True", "at exit 0"]
