"""One ``FastrlServer`` in this process (its engine worker a real Ray actor, no drafter hub), driven where its waits
on the engine go wrong: an engine step that does not return (a hung engine) must not hang ``abort_all_requests``
or ``sleep`` forever, and weights the engine refuses must fail the commit with one line naming the server."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")

import ray  # noqa: E402
import torch  # noqa: E402

from fastrl.integrations.verl import server as server_module  # noqa: E402
from fastrl.integrations.verl.local import FASTRL  # noqa: E402
from fastrl.integrations.verl.server import FastrlServer  # noqa: E402
from fastrl.rollout.cluster import ensure_ray  # noqa: E402
from tests.integrations.verl_setup import verl_config  # noqa: E402

PROMPT = [1, 20, 51, 7]
STALL_S = 6.0  # how long the stubbed engine step stalls: well past the shortened drain deadline below
DRAIN_S = 0.5


@pytest.fixture(scope="module")
def served():
    """A ready server ("waits-0") that releases its memory at ``sleep``, and the one event loop its calls run in."""
    owns = ensure_ray(None, 2)
    config = verl_config([f"{FASTRL}release_at_sleep=true"]).actor_rollout_ref
    server = FastrlServer(config.rollout, config.model, "waits-0", hub=None)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(server.ready())
    yield server, loop
    try:
        loop.run_until_complete(server.shutdown())
    finally:
        loop.close()
        if owns:
            ray.shutdown()


def _stall_the_third_step(actor) -> None:
    """Run inside the engine actor (``__ray_call__``): its third engine step from now stalls ``STALL_S`` seconds
    (a hung engine, for longer than the server waits), then steps on as before."""
    worker, original, count = actor._worker, actor._worker.step, [0]

    def step():
        count[0] += 1
        if count[0] == 3:
            import time

            time.sleep(STALL_S)
        return original()

    worker.step = step


def test_a_hung_engine_fails_abort_and_sleep_naming_the_server_instead_of_hanging(served, monkeypatch):
    """Both waited for the requests in flight with no deadline: a stalled engine step hung them forever."""
    server, loop = served
    monkeypatch.setattr(server_module, "DRAIN_WAIT_S", DRAIN_S)
    sampling = {"max_tokens": 30, "ignore_eos": True}

    async def scenario() -> tuple[str, str, object]:
        await server._worker.__ray_call__.remote(_stall_the_third_step)
        request = asyncio.ensure_future(server.generate(PROMPT, sampling, "stalled"))
        await asyncio.sleep(1.0)  # the engine is inside its stalled step
        errors = []
        for call in (server.abort_all_requests(), server.sleep()):
            with pytest.raises(RuntimeError) as caught:
                await asyncio.wait_for(call, 4 * DRAIN_S)
            errors.append(str(caught.value))
        out = await asyncio.wait_for(request, 30)  # the step returns: the abort sent before ends the request
        await server.abort_all_requests()
        await server.resume_generation()
        await server.sleep()  # verl's retry goes through once the engine steps again
        await server.wake_up()
        return errors[0], errors[1], out

    aborted, slept, out = loop.run_until_complete(scenario())
    assert aborted.startswith("fastrl server waits-0: abort_all_requests: 1 request(s) still in flight")
    assert slept.startswith("fastrl server waits-0: memory not released: 1 request(s) still in flight")
    assert f"{DRAIN_S:g} s" in aborted and out.stop_reason == "aborted"
    again = loop.run_until_complete(server.generate(PROMPT, {"max_tokens": 4, "ignore_eos": True}, "after"))
    assert len(again.token_ids) == 4


def test_refused_weights_fail_the_commit_in_one_line_naming_the_server(served):
    """The engine's ValueError came through as Ray's RayTaskError, its traceback header and all."""
    server, loop = served

    async def scenario() -> tuple[str, int]:
        before = (await server.report()).policy_version
        await server.receive_weights({"nonexistent.weight": torch.zeros(2)})
        with pytest.raises(ValueError) as caught:
            await server.commit_weights(7)
        out = await server.generate(PROMPT, {"max_tokens": 2}, "after-refusal")
        assert out.extra_fields["fastrl_policy_version"] == before
        return str(caught.value), type(caught.value)

    said, kind = loop.run_until_complete(scenario())
    assert kind is ValueError  # not a RayTaskError(ValueError)
    assert said.startswith("fastrl server waits-0: weight commit refused: ValueError: ")
    assert "\n" not in said and "Traceback" not in said and "ray::" not in said
