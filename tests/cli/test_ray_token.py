"""The local Ray that `fastrl train` starts keeps Ray's token authentication (other users of the machine can reach
127.0.0.1) but sets it explicitly, so Ray prints no "Token authentication is enabled ... opt out" warning; and it
leaves the process's SIGTERM and SIGINT handlers as they were (ray.init's own SIGTERM handler exited at once, so a
SIGTERM lost `fastrl train`'s checkpoint on interrupt)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os, signal, ray
from fastrl.rollout.cluster import ensure_ray
def on_term(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, on_term)
before_int = signal.getsignal(signal.SIGINT)
assert ensure_ray(num_cpus=1)
print("handlers kept", signal.getsignal(signal.SIGTERM) is on_term and signal.getsignal(signal.SIGINT) is before_int)
print("mode", os.environ.get("RAY_AUTH_MODE"))
print("answer", ray.get(ray.remote(lambda: 41 + 1).remote()))
ray.shutdown()
"""


def test_local_ray_uses_token_auth_without_a_warning():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "mode token" in done.stdout and "answer 42" in done.stdout and "handlers kept True" in done.stdout
    assert "Token authentication" not in done.stderr and "RAY_AUTH_MODE" not in done.stderr
