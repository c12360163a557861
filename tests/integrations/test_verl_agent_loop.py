"""The fastrl backend inside the real verl 0.9.1: verl's own AgentLoopManager on a local Ray, served by two CPU
fastrl replicas. Order matters inside this module: the last test changes the policy weights."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

pytest.importorskip("verl")

from safetensors.torch import load_file  # noqa: E402

from fastrl.assets_path import bundled_model_dir  # noqa: E402
from fastrl.integrations.export.selection_config import write_selection_configs  # noqa: E402
from fastrl.integrations.verl.local import FASTRL, LocalRollout, chat_batch  # noqa: E402
from fastrl.integrations.verl.requests import request_seed  # noqa: E402
from tests.integrations.verl_setup import N_SAMPLES, PROMPTS, SEED, verl_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPEC_COLUMNS = ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fastrl-export")


@pytest.fixture(scope="module")
def stack(export_dir):
    """verl's LLMServerManager (two fastrl replicas) and AgentLoopManager, plus one rollout of the chat batch."""
    local = LocalRollout.start(verl_config([f"{FASTRL}export_dir={export_dir}"]))
    first = local.agent_loops.generate_sequences(chat_batch(PROMPTS, N_SAMPLES))
    yield local.config, local.servers, local.agent_loops, first
    local.shutdown()


def _rows(output) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt ids, response ids, response log-probs) of each row, padding removed."""
    batch = output.batch
    rows = []
    for i in range(len(output)):
        prompt = batch["prompts"][i][batch["attention_mask"][i, : batch["prompts"].shape[1]].bool()].tolist()
        mask = batch["response_mask"][i].bool()
        rows.append((prompt, batch["responses"][i][mask].tolist(), batch["rollout_log_probs"][i][mask].tolist()))
    return rows


def test_agent_loop_returns_verl_columns_and_spec_metrics(stack):
    config, servers, _, out = stack
    assert [r._server_address for r in servers.get_replicas()] == [
        "fastrl://fastrl_server_0_0",
        "fastrl://fastrl_server_1_0",
    ]
    assert len(out) == len(PROMPTS) * N_SAMPLES
    for key in ("prompts", "responses", "response_mask", "rollout_log_probs", "attention_mask", "input_ids"):
        assert key in out.batch.keys(), key
    assert out.batch["responses"].shape[1] == config.actor_rollout_ref.rollout.response_length
    rows = _rows(out)
    assert all(len(response) > 0 for _, response, _ in rows)
    assert all(all(lp <= 0 for lp in logprobs) for _, _, logprobs in rows)
    # GRPO groups: the n samples of a prompt share it and (sampled, seeded by request id) differ.
    assert rows[0][0] == rows[1][0] and rows[0][1] != rows[1][1]
    drafted, accepted, steps = (np.asarray(out.non_tensor_batch[c], dtype=np.int64) for c in SPEC_COLUMNS)
    lengths = out.batch["response_mask"].sum(dim=1).numpy()
    # one token from prefill, then each round adds its accepted drafts + 1, but for the drafts a round accepted past
    # where its request finished (counted, as vLLM counts them)
    assert (accepted + steps >= lengths - 1).all() and (steps <= lengths - 1).all()
    assert (accepted <= drafted).all() and accepted.sum() > 0
    assert list(out.non_tensor_batch["global_steps"]) == [None] * len(out)


def test_request_through_verl_equals_fastrl_generate(stack, tmp_path):
    """Same prompt ids and seed (derived from verl's deterministic request id) through `fastrl generate`:
    the same tokens and log-probs, although the servers speculate with the bandit and fastrl generate does not."""
    _, _, _, out = stack
    rows = _rows(out)
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt_ids": p, "seed": request_seed(SEED, f"det-{i}")} for i, (p, _, _) in enumerate(rows)]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    output = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "fastrl.cli", "generate", f"prompts={prompts}", f"output={output}"]
    cmd += ["max_new_tokens=40", "temperature=1.0", "progress=false", "strategy=disable"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, capture_output=True, timeout=120)
    generated = [json.loads(line) for line in output.read_text().splitlines()]
    for (_, response, logprobs), line in zip(rows, generated, strict=True):
        assert line["token_ids"] == response
        assert line["logprobs"] == pytest.approx(logprobs, abs=1e-4)


def test_idle_server_cotrains_in_the_tail_and_sleep_merges_drafters(stack, export_dir, tmp_path):
    """Server 1 finishes its short requests while server 0 runs long ones: server 1 co-trains in that tail.
    At sleep the co-trained copies are averaged into the next drafter version on both servers; the bandit's state
    and the engines survive sleep / wake_up."""
    _, servers, agent_loops, first = stack
    replicas = servers.get_replicas()
    prompt = _rows(first)[0][0]

    sampled = {"temperature": 1.0, "logprobs": False}

    def generate(replica, tokens: int, request_id: str):
        params = {**sampled, "max_tokens": tokens, "ignore_eos": True}
        return (
            replicas[replica]
            .servers[0]
            .generate.remote(prompt_ids=prompt, sampling_params=params, request_id=request_id)
        )

    async def tail():
        """Server 0 always has a long request in flight (the next is sent before the last is awaited) while server 1
        finishes short ones and goes idle, until server 1 reports co-training steps (a few tries: whether the hub
        has heard that server 0 is busy when server 1 asks is a race between two actors' calls)."""
        long, lengths = generate(0, 40, "long-0"), []
        for attempt in range(20):
            await generate(1, 2, f"short-{attempt}")
            following = generate(0, 40, f"long-{attempt + 1}")
            lengths.append(len((await long).token_ids))
            long = following
            if (await replicas[1].reports())[0].cotrain_steps > 0:
                break
        lengths.append(len((await long).token_ids))
        return lengths

    async def state():
        reports = [r for replica in replicas for r in await replica.reports()]
        bandits = [await replica.servers[0].strategy_selector_state.remote() for replica in replicas]
        return reports, bandits

    assert set(asyncio.run(tail())) == {40}
    before, bandits = asyncio.run(state())
    assert before[1].cotrain_steps > 0  # the idle server trained while the other ran the tail

    async def sleep_and_wake():
        await asyncio.gather(*[replica.sleep() for replica in replicas])
        await asyncio.gather(*[replica.wake_up() for replica in replicas])

    asyncio.run(sleep_and_wake())
    after, bandits_after = asyncio.run(state())
    assert {r.drafter_version for r in after} == {before[0].drafter_version + 1}  # merged, pushed to every server
    assert bandits_after == bandits  # the strategy selector survives sleep / wake_up untouched
    state = export_dir / "bandit_state_fastrl_server_0_0.json"  # written at sleep: input of export-drafter
    assert json.loads(state.read_text()) == bandits[0]
    assert len(write_selection_configs(state, tmp_path, "draft")) == 4  # one winner per batch-size bucket
    out = agent_loops.generate_sequences(chat_batch(PROMPTS, N_SAMPLES))
    assert set(out.non_tensor_batch["fastrl_drafter_version"]) == {after[0].drafter_version}
    assert [r[1] for r in _rows(out)] == [r[1] for r in _rows(first)]  # a new drafter never changes tokens


def test_abort_closes_admission_until_resume(stack):
    _, servers, _, first = stack
    server = servers.get_replicas()[0].servers[0]
    request = {"prompt_ids": _rows(first)[0][0], "sampling_params": {"max_tokens": 2, "temperature": 0.0}}

    async def run():
        await servers.get_replicas()[0].abort_all_requests(reject_request=True)  # nothing in flight: returns
        turned_away = await server.generate.remote(request_id="while-paused", **request)
        await servers.get_replicas()[0].resume_generation()
        return turned_away, await server.generate.remote(request_id="after-resume", **request)

    turned_away, after = asyncio.run(run())
    _assert_turned_away(turned_away)
    assert len(after.token_ids) == 2


def _assert_turned_away(out) -> None:
    """What vLLM's server answers a request that meets an abort that rejects (its server left the rotation): no
    tokens and ``stop_reason="aborted"``, which sends verl's client to another server; every column verl reads."""
    assert out.token_ids == [] and out.stop_reason == "aborted"
    spec = {k: v for k, v in out.extra_fields.items() if k.startswith("spec_")}
    assert spec and set(spec.values()) == {0}
    assert isinstance(out.extra_fields["fastrl_policy_version"], int) and "global_steps" in out.extra_fields


def test_a_request_whose_budget_is_spent_carries_every_column_verl_reads(stack):
    """max_tokens=0 (a multi-turn conversation at its budget) returned no spec counts or versions: verl's metric
    step then compared None with 0."""
    _, servers, _, first = stack
    server = servers.get_replicas()[0].servers[0]
    request = {"prompt_ids": _rows(first)[0][0], "sampling_params": {"max_tokens": 0, "logprobs": True}}
    out = ray.get(server.generate.remote(request_id="spent", **request))
    assert out.token_ids == [] and out.log_probs == [] and out.stop_reason == "length"
    fields = out.extra_fields
    assert {k: v for k, v in fields.items() if k.startswith("spec_")} and all(
        v == 0 for k, v in fields.items() if k.startswith("spec_")
    )
    assert isinstance(fields["fastrl_policy_version"], int) and isinstance(fields["fastrl_drafter_version"], int)


def _long(prompt: list[int], request_id: str, tokens: int = 40) -> dict:
    """A request that runs ``tokens`` tokens (40: to the end of the context)."""
    sampling = {"max_tokens": tokens, "temperature": 1.0, "ignore_eos": True}
    return {"prompt_ids": prompt, "sampling_params": sampling, "request_id": request_id}


async def _in_flight(server, count: int) -> None:
    """Wait (a few seconds at most) until ``count`` requests are in flight on ``server``, so that what the test
    sends next meets them running."""
    for _ in range(2000):
        if (await server.report.remote()).in_flight >= count:
            return
        await asyncio.sleep(0.002)


def test_a_weight_commit_never_reopens_what_an_abort_closed(stack):
    """abort_all_requests(reject) arrives while a commit waits for a request in flight: when both are done,
    admission stays closed until resume_generation (the commit used to reopen it)."""
    _, servers, _, first = stack
    server = servers.get_replicas()[0].servers[0]
    prompt = _rows(first)[0][0]
    state = load_file(str(bundled_model_dir() / "model.safetensors"))  # the weights it serves: outputs unchanged

    async def run():
        running = [server.generate.remote(**_long(prompt, f"commit-long-{i}")) for i in range(8)]
        await _in_flight(server, 8)
        await server.receive_weights.remote(state)
        commit = server.commit_weights.remote()
        abort = server.abort_all_requests.remote(reject_request=True)
        await asyncio.gather(*running)
        await commit, await abort
        turned_away = await server.generate.remote(**_long(prompt, "after-commit"))
        await server.resume_generation.remote()
        return turned_away, await server.generate.remote(**_long(prompt, "after-resume"))

    turned_away, after = asyncio.run(run())
    _assert_turned_away(turned_away)
    assert len(after.token_ids) > 0


def test_an_abort_that_rejects_turns_away_the_requests_waiting_for_admission(stack):
    _, servers, _, first = stack
    server = servers.get_replicas()[0].servers[0]
    prompt = _rows(first)[0][0]

    async def run():
        await server.abort_all_requests.remote(reject_request=False)
        parked = server.generate.remote(**_long(prompt, "parked"))  # waits for admission
        await server.abort_all_requests.remote(reject_request=True)
        out = await asyncio.wait_for(parked, timeout=60)  # it used to wait for a resume that may never come
        await server.resume_generation.remote()
        return out

    _assert_turned_away(asyncio.run(run()))


def test_abort_all_requests_ends_requests_in_flight_with_a_prefix_of_their_tokens(stack):
    """abort_all_requests used to wait for every request in flight to finish (the whole tail, before a weight
    sync); now each returns at the engine's next step with stop_reason "aborted" and the tokens it had: a prefix of
    what the same request (same id: same seed) gives when it runs to its end."""
    _, servers, _, first = stack
    server = servers.get_replicas()[0].servers[0]
    prompt = _rows(first)[0][0]

    async def attempt(n: int):
        ids = [f"abort-{n}-{i}" for i in range(8)]
        running = [server.generate.remote(**_long(prompt, rid)) for rid in ids]
        await _in_flight(server, 8)
        answer = await server.abort_all_requests.remote()
        outs = await asyncio.gather(*running)
        await server.resume_generation.remote()
        return ids, answer, outs

    async def run():
        for n in range(5):  # the requests may all finish before the abort arrives: try again
            ids, answer, outs = await attempt(n)
            if answer["aborted_count"]:
                full = await asyncio.gather(*[server.generate.remote(**_long(prompt, rid)) for rid in ids])
                return ids, answer, outs, full
        pytest.fail("no request was in flight when abort_all_requests came, in 5 tries")

    ids, answer, outs, full = asyncio.run(run())
    assert answer["aborted_count"] == len(answer["request_ids"]) and set(answer["request_ids"]) <= set(ids)
    for rid, out, whole in zip(ids, outs, full, strict=True):
        assert whole.stop_reason == "length" and len(whole.token_ids) > 0
        if rid in answer["request_ids"]:
            assert out.stop_reason == "aborted"
            assert len(out.token_ids) < len(whole.token_ids)
            assert out.token_ids == whole.token_ids[: len(out.token_ids)]
        else:
            assert out.token_ids == whole.token_ids and out.stop_reason == whole.stop_reason


def test_a_cancelled_call_stays_in_flight_until_the_engine_ends_its_request(stack):
    """A caller that cancels aborts its request (the engine ends it at its next step): it counts as in flight until
    then, abort_all_requests waits for that, and then its id is free again (it used to be reported idle while the
    engine still ran it)."""
    import ray

    _, servers, _, first = stack
    server = servers.get_replicas()[0].servers[0]
    prompt = _rows(first)[0][0]

    async def run():
        call = server.generate.remote(**_long(prompt, "to-cancel"))
        others = [server.generate.remote(**_long(prompt, f"short-{i}", tokens=4)) for i in range(4)]
        await _in_flight(server, 1)
        ray.cancel(call)  # its request is aborted; an abort_all_requests meanwhile waits for that
        try:
            await call
        except (ray.exceptions.TaskCancelledError, asyncio.CancelledError):
            pass
        await asyncio.gather(*others)
        await server.abort_all_requests.remote(reject_request=False)
        in_flight = (await server.report.remote()).in_flight
        await server.resume_generation.remote()
        return in_flight, await server.generate.remote(**_long(prompt, "to-cancel"))

    in_flight, again = asyncio.run(run())
    assert in_flight == 0 and len(again.token_ids) > 0


def _rounds_and_failures(replicas) -> tuple[list[int], list[str]]:
    """Each server's merge rounds so far, and the failures its drafter hub recorded."""
    from fastrl.integrations.verl.replica import hub_name

    async def reports() -> list[int]:
        return [r.rollouts for replica in replicas for r in await replica.reports()]

    hub = ray.get_actor(hub_name(replicas[0].name_suffix))
    return asyncio.run(reports()), ray.get(hub.report.remote())["failures"]


def test_a_repeated_sleep_is_a_no_op_and_the_merge_rounds_stay_aligned(stack):
    """A second sleep of one replica (a retried sleep) counted as another merge round: it waited the whole
    drafter_sync_timeout_s (60 s here) alone, and from then on every joint sleep waited it out too, the other
    server's copies never merged. Now a sleep before the next wake_up (or weight commit) ends nothing."""
    replicas = stack[1].get_replicas()

    async def sleep(*which: int) -> None:
        await asyncio.wait_for(asyncio.gather(*[replicas[i].sleep() for i in which]), timeout=30)

    async def wake() -> None:
        await asyncio.gather(*[replica.wake_up() for replica in replicas])

    asyncio.run(sleep(0, 1))
    rounds, failures = _rounds_and_failures(replicas)
    assert rounds[0] == rounds[1]
    asyncio.run(sleep(0))  # again, before any wake_up: returns at once
    assert _rounds_and_failures(replicas) == (rounds, failures)
    asyncio.run(wake())
    asyncio.run(sleep(0, 1))  # the next joint sleep merges at once, both servers in it
    asyncio.run(wake())
    assert _rounds_and_failures(replicas) == ([n + 1 for n in rounds], failures)


def test_a_weight_commit_starts_a_rollout_that_the_next_sleep_ends(stack):
    """verl wakes its replicas by updating their weights (with free_cache_engine off it never calls wake_up): the
    sleep after a commit is a merge round like any other, on every server at once."""
    replicas = stack[1].get_replicas()
    state = load_file(str(bundled_model_dir() / "model.safetensors"))  # the weights they serve: outputs unchanged

    async def cycle() -> None:
        await asyncio.gather(*[replica.sleep() for replica in replicas])
        for replica in replicas:
            await replica.servers[0].receive_weights.remote(state)
        await asyncio.gather(*[replica.servers[0].commit_weights.remote() for replica in replicas])
        await asyncio.wait_for(asyncio.gather(*[replica.sleep() for replica in replicas]), timeout=30)
        await asyncio.gather(*[replica.wake_up() for replica in replicas])

    rounds, failures = _rounds_and_failures(replicas)
    asyncio.run(cycle())
    assert _rounds_and_failures(replicas) == ([n + 2 for n in rounds], failures)


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("tensor_model_parallel_size", 2, "tensor_model_parallel_size=2: the fastrl rollout runs one device"),
        ("ignore_eos", "yes", "ignore_eos must be true or false, got 'yes'"),  # every request failed on it
        ("logprobs_mode", "raw_logprobs", "logprobs_mode=raw_logprobs: the fastrl rollout returns the log-probs of"),
    ],
)
def test_rollout_keys_fastrl_cannot_honour_are_refused_naming_the_key(stack, key, value, said):
    from omegaconf import OmegaConf

    from fastrl.integrations.verl.replica import FastrlReplica

    config = stack[0]
    rollout = OmegaConf.merge(config.actor_rollout_ref.rollout, {key: value})
    with pytest.raises(ValueError, match=f"actor_rollout_ref.rollout.{said}"):
        FastrlReplica(replica_rank=0, config=rollout, model_config=config.actor_rollout_ref.model, gpus_per_node=2)


def test_update_weights_from_a_generator_or_an_async_one_changes_outputs_and_version(stack):
    from fastrl.integrations.verl.adapter import FastrlServerAdapter

    config, servers, agent_loops, first = stack
    rollout, model = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model
    state = load_file(str(bundled_model_dir() / "model.safetensors"))
    state["lm_head.weight"] = state["lm_head.weight"] + 0.5 * torch.randn(
        state["lm_head.weight"].shape, generator=torch.Generator().manual_seed(0)
    )

    async def streamed():  # what verl's nccl / nixl checkpoint engines hand the adapter: an async generator
        for item in state.items():
            yield item

    async def push(rank: int) -> int:
        adapter = FastrlServerAdapter(config=rollout, model_config=model, device_mesh=None, replica_rank=rank)
        weights = ((k, v) for k, v in state.items()) if rank == 0 else streamed()  # the naive engine's, and theirs
        return await adapter.update_weights(weights, global_steps=5)

    assert [asyncio.run(push(rank)) for rank in range(len(servers.get_replicas()))] == [5, 5]
    out = agent_loops.generate_sequences(chat_batch(PROMPTS, N_SAMPLES))
    assert list(out.non_tensor_batch["global_steps"]) == [5] * len(out)
    assert set(out.non_tensor_batch["fastrl_policy_version"]) == {5}
    assert [r[1] for r in _rows(out)] != [r[1] for r in _rows(first)]


def test_a_reward_model_served_by_fastrl_in_the_same_job_has_its_own_servers_and_hub(stack):
    """verl builds a generative reward model's replicas with the rollout's class: their servers and drafter hub
    are that role's (it used to be an ActorAlreadyExistsError on the policy's server name, and with other names the
    reward model's drafters would have merged into the policy's hub)."""
    from fastrl.integrations.verl.replica import FastrlReplica, hub_name

    config, servers = stack[0], stack[1]
    rollout, model = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model
    reward = FastrlReplica(replica_rank=0, config=rollout, model_config=model, gpus_per_node=1, is_reward_model=True)
    asyncio.run(reward.init_standalone())
    try:
        policy_hub = hub_name(servers.get_replicas()[0].name_suffix)
        assert reward._server_address == "fastrl://fastrl_server_reward_0_0"
        assert ray.get(ray.get_actor(hub_name(reward.name_suffix, "reward_")).report.remote())["members"] == [
            "fastrl_server_reward_0_0"
        ]
        assert "fastrl_server_reward_0_0" not in ray.get(ray.get_actor(policy_hub).report.remote())["members"]
    finally:
        asyncio.run(reward.shutdown())


def test_replicas_of_another_mode_merge_in_their_own_hub(stack):
    """verl's separate-async trainer runs the policy's hybrid replicas, which sleep at every switch to the trainer,
    beside standalone ones that keep serving and never sleep: in one hub, every hybrid sleep waited the whole
    drafter_sync_timeout_s for the standalone servers and merged without them. A hybrid replica (launched here on
    the CPU as its mode's replica would be) joins its mode's hub, and its sleep merges with no one missing."""
    from verl.workers.rollout.replica import RolloutMode

    from fastrl.integrations.verl.replica import FastrlReplica, hub_name

    config, servers = stack[0], stack[1]
    rollout, model = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model
    hybrid = FastrlReplica(replica_rank=2, config=rollout, model_config=model, gpus_per_node=1)
    hybrid.rollout_mode = RolloutMode.HYBRID
    asyncio.run(hybrid.launch_servers())
    try:
        standalone = ray.get(ray.get_actor(hub_name(servers.get_replicas()[0].name_suffix)).report.remote())
        own = ray.get_actor(hub_name(hybrid.name_suffix, mode="HYBRID"))
        assert ray.get(own.report.remote())["members"] == ["fastrl_server_2_0"]
        assert "fastrl_server_2_0" not in standalone["members"]
        asyncio.run(hybrid.sleep())
        report = ray.get(own.report.remote())
        assert report["next_round"] == 1 and report["failures"] == []
    finally:
        asyncio.run(hybrid.shutdown())


def test_shutdown_ends_the_drafter_hub(stack):
    """The last server to shut down ends the job's drafter hub, so a later job in the same Ray session starts from
    a fresh one (it used to find the old hub, its versions and members)."""
    import time

    import ray

    from fastrl.integrations.verl.replica import hub_name

    replicas = stack[1].get_replicas()
    name = hub_name(replicas[0].name_suffix)
    ray.get_actor(name)
    asyncio.run(replicas[0].shutdown())
    assert ray.get(ray.get_actor(name).report.remote())["members"] == ["fastrl_server_1_0"]
    time.sleep(3)  # the first server's handles are released by now: the hub must still serve the second
    assert ray.get(ray.get_actor(name).report.remote())["members"] == ["fastrl_server_1_0"]
    asyncio.run(replicas[1].shutdown())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(ray.get_actor(name).report.remote(), timeout=5)
        except (ValueError, ray.exceptions.RayActorError):
            return
        time.sleep(0.2)
    pytest.fail(f"the drafter hub {name} outlived its servers")
