"""The paged KV cache in the engine: pages follow tokens, shared prompt pages are bitwise those of an unshared
prefill, and a pool a tenth of the workload's size waits or preempts and still gives the unconstrained outputs."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.page_pool import PagePool
from fastrl.models.checkpoint import load_model
from fastrl.models.kv_cache import KVCache, PageTable
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", seed=7, max_positions=512).save_pretrained(path)
    return load_model(path).double()


def _workload(vocab: int, count: int, seed: int) -> list[GenerateInput]:
    """Long-tail lengths, greedy and sampled rows, GRPO-like groups sharing a prompt at the start and at the end
    (under memory pressure the last group is admitted with preempted requests being recomputed)."""
    rng = random.Random(seed)
    first, last = ([rng.randrange(3, vocab) for _ in range(n)] for n in (21, 19))
    out = []
    for i in range(count):
        prompt = (
            first if i < 6 else last if i >= count - 6 else [rng.randrange(3, vocab) for _ in range(rng.randint(3, 30))]
        )
        new = rng.choice([4, 9, 17, 40, 90])
        params = SamplingParams(max_new_tokens=new, temperature=rng.choice([0.0, 1.0]), seed=i, ignore_eos=True)
        out.append(GenerateInput(prompt, params, request_id=f"r{i}"))
    return out


def _needed_tokens(inputs: list[GenerateInput]) -> int:
    return sum(len(i.prompt_ids) + i.params.max_new_tokens for i in inputs)


def test_pool_hands_out_lowest_pages_shares_by_reference_and_frees_at_last_release():
    pool = PagePool(num_pages=6, page_size=4)
    assert pool.ensure(0, 9) and pool.pages_of(0) == [0, 1, 2]
    assert pool.share(0, 1, 9) and pool.pages_of(1) == [0, 1, 3]  # two full pages shared, the partial one fresh
    updates = pool.drain()
    assert updates.copies == [(2, 3)] and updates.fresh == [0, 1, 2, 3]
    assert updates.table[(1, 0)] == 0 and updates.table[(1, 2)] == 3
    assert not pool.ensure(2, 13) and pool.pages_of(2) == []  # 4 pages wanted, 2 free: nothing taken
    pool.release(0)
    assert pool.free_pages == 3  # page 2 only: 0 and 1 are still held by slot 1
    pool.release(1)
    assert pool.free_pages == 6 and pool.drain().table[(1, 1)] is None
    assert pool.ensure(2, 1) and pool.pages_of(2) == [0]


def test_home_pages_keep_a_slot_in_place_and_shared_or_borrowed_pages_do_not():
    pool = PagePool(num_pages=12, page_size=4, home_stride=3)  # slot s's home pages are 3s, 3s+1, 3s+2
    assert pool.ensure(1, 9) and pool.pages_of(1) == [3, 4, 5] and pool.at_home(1)
    assert pool.share(1, 2, 5) and pool.pages_of(2) == [3, 7]  # its prompt's full page is slot 1's
    assert not pool.at_home(2) and pool.at_home(1)
    assert pool.ensure(0, 4) and pool.pages_of(0) == [0] and pool.at_home(0)
    pool.release(2)
    assert pool.drain().freed == [7] and pool.ensure(2, 8) and pool.pages_of(2) == [6, 7] and pool.at_home(2)
    assert pool.free_pages == 12 - 6


def test_a_home_view_reads_what_a_gather_reads():
    table = PageTable(3, 32, 4, num_pages=24, scratch_len=4, home_stride=8)
    cache = KVCache(2, 3, 32, 2, 8, dtype=torch.float64, table=table)
    table.map([1] * 5 + [2] * 5, list(range(5)) * 2, list(range(8, 13)) + list(range(16, 21)))  # home pages
    slots = torch.tensor([1, 2])
    index = torch.arange(20).expand(2, 20)
    cache.write(1, slots, index, *(torch.randn(2, 2, 20, 8, dtype=torch.float64) for _ in range(2)))
    viewed = cache.home_view(1, 1, 2, 19)
    gathered = cache.read(1, slots, 19)
    assert all(torch.equal(a, b) for a, b in zip(viewed, gathered, strict=True))
    assert viewed[0].abs().sum() > 0


def test_shared_prompt_pages_are_bitwise_an_unshared_prefill(model):
    prompt = list(range(5, 42))  # 37 tokens: two full pages of 16 shared, the last partial page copied
    params = SamplingParams(max_new_tokens=3, temperature=1.0, ignore_eos=True)
    shared = Engine(model, EngineConfig(max_batch_size=4, dtype="float64"))
    for i in range(3):
        shared.add_request(prompt, params, request_id=f"s{i}")
    alone = Engine(model, EngineConfig(max_batch_size=4, dtype="float64", prefix_sharing=False))
    alone.add_request(prompt, params)  # the same prompt prefilled on its own (a batch of 1, as the shared one ran)
    shared.step()
    alone.step()
    assert shared.prefill_rows.computed == 1
    pages = [shared.runner.pool.pages_of(slot) for slot in range(3)]
    assert pages[1][:2] == pages[0][:2] == pages[2][:2]
    assert len({p[2] for p in pages}) == 3  # each sibling continues on its own copy of the partial page
    for layer in range(model.config.num_hidden_layers):
        k_alone, v_alone = alone.runner.cache.read(layer, torch.tensor([0]), len(prompt))
        k, v = shared.runner.cache.read(layer, torch.tensor([0, 1, 2]), len(prompt))
        assert torch.equal(k, k_alone.expand_as(k)) and torch.equal(v, v_alone.expand_as(v))


@pytest.mark.parametrize("strategy", ["disable", "3_2_6"])
def test_a_tenth_of_the_cache_waits_or_preempts_and_changes_no_output(model, strategy):
    inputs = _workload(model.config.vocab_size, 40, seed=3)
    drafter = None
    if strategy != "disable":
        torch.manual_seed(0)
        drafter = EagleDrafter(model.config).double()
    base = dict(max_batch_size=40, dtype="float64", max_model_len=128, page_size=8)
    free = Engine(model, EngineConfig(**base), drafter=drafter, selector=FixedSelector(strategy))
    want = free.generate(inputs)
    tight_tokens = _needed_tokens(inputs) // 10
    assert tight_tokens >= 128 + 8  # one request of the context length still fits
    tight = Engine(model, EngineConfig(**base, kv_cache_tokens=tight_tokens), drafter, FixedSelector(strategy))
    held_pages = []
    for i in inputs:
        tight.add_request(i.prompt_ids, i.params, i.request_id)
    got = {}
    while tight.has_unfinished():
        for out in tight.step():
            if out.finished:
                got[out.request_id] = out
        held_pages.append(tight.runner.pool.used_pages)
    assert tight.scheduler.preemptions > 0
    assert max(held_pages) <= tight.runner.pool.num_pages and tight.runner.pool.used_pages == 0
    for a in want:
        b = got[a.request_id]
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
        assert b.logprobs == pytest.approx(a.logprobs, rel=0, abs=1e-9)


def test_pages_follow_the_tokens_alive(model):
    inputs = _workload(model.config.vocab_size, 12, seed=5)
    engine = Engine(model, EngineConfig(max_batch_size=12, dtype="float64", max_model_len=160, page_size=8))
    pool = engine.runner.pool
    for i in inputs:
        engine.add_request(i.prompt_ids, i.params, i.request_id)
    while engine.has_unfinished():
        engine.step()
        running = [r for r in engine.scheduler.running if not r.finished]
        alive = sum(pool.pages_for(r.num_tokens - 1 + engine.runner.lookahead) for r in running)
        assert pool.used_pages <= alive  # shared prompt pages make it fewer, never more
    assert pool.used_pages == 0


def test_a_pool_too_small_for_one_request_is_refused(model):
    with pytest.raises(ValueError, match="engine.kv_cache_tokens"):
        Engine(model, EngineConfig(max_batch_size=2, max_model_len=100, kv_cache_tokens=50))


def test_a_recompute_and_a_shared_prompt_admitted_in_one_step(model):
    """A preempted request readmitted in the same step as a new GRPO group: the group's shared pages and the
    recomputed KV both hold, and every output equals the unconstrained run's."""
    base = dict(max_batch_size=4, dtype="float64", max_model_len=128, page_size=8)
    params = [
        SamplingParams(max_new_tokens=n, temperature=1.0, seed=i, ignore_eos=True) for i, n in enumerate((110, 100))
    ]
    group = SamplingParams(max_new_tokens=5, temperature=1.0, ignore_eos=True)
    jobs = [([5 + i for i in range(10)], params[0], "a"), ([7 + i for i in range(10)], params[1], "b")]
    jobs += [([9 + i % 20 for i in range(13)], group, f"g{j}") for j in range(2)]

    def run(tokens: int | None) -> tuple[dict, list[set[str]]]:
        engine = Engine(model, EngineConfig(**base, kv_cache_tokens=tokens))
        for prompt, p, rid in jobs[:2]:
            engine.add_request(prompt, p, rid)
        outs, admitted_together, step, added = {}, [], 0, False
        while engine.has_unfinished():
            before = {r.request_id for r in engine.scheduler.running}
            outs.update({o.request_id: o for o in engine.step() if o.finished})
            admitted_together.append({r.request_id for r in engine.scheduler.running} - before)
            step += 1
            if not added and (step == 50 if tokens is None else engine.scheduler.preemptions == 1):
                added = True
                for prompt, p, rid in jobs[2:]:  # the group arrives while "b" waits for pages (tight run)
                    engine.add_request(prompt, p, rid)
        assert tokens is None or engine.scheduler.preemptions > 0
        return outs, admitted_together

    free, _ = run(None)
    tight, together = run(136)
    assert any({"b", "g0", "g1"} <= ids for ids in together)
    for rid, out in free.items():
        assert tight[rid].token_ids == out.token_ids
