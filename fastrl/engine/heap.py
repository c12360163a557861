"""The Python heap of a process that decodes: what start-up allocated, frozen out of the cyclic collector's way.

Importing torch and transformers and loading a model leave ~170k objects that the cyclic garbage collector tracks.
Decoding allocates small objects every round (round statistics, request outputs, the history index's n-gram
lists), and every few seconds the collector's full pass walks the whole heap, start-up's objects included: on this
CPU such a pass took 150-190 ms, once per ~3.6 s of lockstep decoding on 64 short prompts x 4 at batch 16 (4-5% of
the decoding time, falling on whichever round happened to allocate last). ``gc.freeze`` moves every object alive
into a generation the collector never scans, so those passes walk only what decoding itself keeps (measured after
freezing: no pass over 6 ms).

Frozen objects are still freed by reference counting; only cycles among them would wait. A process that holds an
engine for its whole life (a rollout worker actor) settles once (``settle_heap``); a command that runs inside a
caller's process (``fastrl generate`` called from Python) settles for its run (``settled_heap``) and gives the
frozen objects back to the collector when it ends.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager


def settle_heap() -> int:
    """Collect the young generations' garbage, then freeze every object alive (see the module docstring); at exit
    they are unfrozen, so the interpreter's last collection frees them as usual (extension modules such as Triton's
    report objects never freed otherwise). A full collection first would cost what the passes it spares cost (~190
    ms); what it would find, cycles that start-up dropped after they aged, waits frozen: a bounded, one-time sum.
    Returns the number of objects frozen."""
    gc.collect(1)
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # one exit hook, however often a process settles
    atexit.register(gc.unfreeze)
    return gc.get_freeze_count()


@contextmanager
def settled_heap() -> Iterator[int]:
    """``settle_heap`` for the ``with`` block (yields the number of objects frozen), the heap given back to the
    collector at its end, whatever ends it."""
    try:
        yield settle_heap()
    finally:
        gc.unfreeze()
