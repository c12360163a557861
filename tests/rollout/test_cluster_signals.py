"""A signal to the command's process group (``timeout``, ``kill -TERM -PGID``) reaches the command, not the local
Ray it started: the raylet used to die with it, so a `fastrl train` that had held the signal to finish its step
lost its workers, hung until Ray gave up on its GCS, and saved no checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

CHILD = textwrap.dedent(
    """
    import signal, sys
    import ray
    from fastrl.rollout.cluster import ensure_ray

    held = []
    signal.signal(signal.SIGTERM, lambda *_: held.append("SIGTERM"))  # held, as the trainer holds it
    ensure_ray(num_cpus=1)

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self, x):
            return x

    echo = Echo.remote()
    print("ready", ray.get(echo.ping.remote(1)), flush=True)
    sys.stdin.readline()  # the parent has signalled the whole group
    fresh = Echo.remote()  # a new actor needs the GCS and the raylet (a call on a live one goes to it directly)
    print("after", held, ray.get(fresh.ping.remote(2), timeout=60), len(ray.nodes()), flush=True)
    ray.shutdown()
    """
)


@pytest.mark.xdist_group("ray")
def test_a_signal_to_the_process_group_leaves_the_local_ray_running():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # the child's group: the command and what it started, apart from pytest
        env=env,
    )
    try:
        assert child.stdout.readline().split() == ["ready", "1"]
        os.killpg(child.pid, signal.SIGTERM)
        time.sleep(3.0)  # what the signal kills is gone by now
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().split() == ["after", "['SIGTERM']", "2", "1"]
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


AFTER_SHUTDOWN = textwrap.dedent(
    """
    import os, signal, time
    from fastrl.rollout.cluster import ensure_ray, shutdown_ray

    def terminate(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)  # what `fastrl` installs: SIGTERM unwinds like Ctrl-C
    ensure_ray(num_cpus=1)
    shutdown_ray()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("not raised", flush=True)
    except KeyboardInterrupt as err:
        print("unwound:", err, flush=True)
    """
)


@pytest.mark.xdist_group("ray")
def test_a_sigterm_after_ray_shut_down_still_unwinds():
    """Ray's shutdown put SIGTERM back to the default under Python's record of fastrl's handler: a SIGTERM after
    the last step (a scheduler's, at the end of a job) killed `fastrl train` before its W&B run and report were
    written, leaving an empty W&B record."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", AFTER_SHUTDOWN], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "unwound: signal 15", (done.returncode, done.stderr[-500:])
