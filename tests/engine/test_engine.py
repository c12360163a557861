"""Engine: plain decoding equals transformers greedy generate; batching never changes a request's output."""

from __future__ import annotations

import pytest
import torch

from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.request import FinishReason
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from tests.helpers import TINY_FAMILIES, make_hf_model


def _hf_greedy(hf_model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """HF greedy continuation and, per generated token, the gap between its top-2 logits (EOS not special)."""
    hf_model.generation_config.eos_token_id = None
    out = hf_model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    tokens = out.sequences[0, len(prompt) :].tolist()
    gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return tokens, gaps


def assert_matches_hf(ours: list[int], theirs: list[int], gaps: list[float]) -> None:
    """Token-for-token equality up to the first position whose top-2 logits tie within 1e-5."""
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if gaps[i] < 1e-5:
            return
        assert a == b, f"position {i}: fastrl {a} != transformers {b} (top-2 gap {gaps[i]:.2e})"
    assert len(ours) == len(theirs)


def _prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, vocab, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_greedy_matches_transformers(family, tmp_path):
    hf = make_hf_model(family)
    hf.save_pretrained(tmp_path)
    engine = Engine(load_model(tmp_path), EngineConfig(max_batch_size=4))
    prompts = _prompts(97, 6)
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    outs = engine.generate([GenerateInput(p, params) for p in prompts])
    for prompt, out in zip(prompts, outs, strict=True):
        theirs, gaps = _hf_greedy(hf, prompt, 24)
        assert_matches_hf(out.token_ids, theirs, gaps)
        assert out.finish_reason == FinishReason.LENGTH


def _mixed_params(i: int) -> SamplingParams:
    settings = [
        dict(temperature=0.0),
        dict(temperature=1.0),
        dict(temperature=0.7, top_p=0.9),
        dict(temperature=1.0, top_k=20),
    ]
    return SamplingParams(max_new_tokens=8 + 3 * i, seed=1000 + i, **settings[i % 4])


def test_request_is_independent_of_its_batch(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path)
    model = load_model(tmp_path)
    prompts = _prompts(97, 16, seed=1)
    inputs = [GenerateInput(p, _mixed_params(i)) for i, p in enumerate(prompts)]
    batched = Engine(model, EngineConfig(max_batch_size=16)).generate(inputs)
    for i, inp in enumerate(inputs):
        alone = Engine(model, EngineConfig(max_batch_size=1)).generate([inp])[0]
        assert alone.token_ids == batched[i].token_ids, f"request {i} changed inside the batch"
        assert alone.logprobs == pytest.approx(batched[i].logprobs, abs=1e-5)


def test_continuous_batching_with_fewer_slots_than_requests(tmp_path):
    make_hf_model("qwen2").save_pretrained(tmp_path)
    model = load_model(tmp_path)
    prompts = _prompts(97, 10, seed=2)
    inputs = [GenerateInput(p, _mixed_params(i)) for i, p in enumerate(prompts)]
    wide = Engine(model, EngineConfig(max_batch_size=10)).generate(inputs)
    narrow = Engine(model, EngineConfig(max_batch_size=3)).generate(inputs)
    assert [o.token_ids for o in wide] == [o.token_ids for o in narrow]
    assert [len(o.token_ids) for o in wide] == [inp.params.max_new_tokens for inp in inputs]


def test_stop_tokens_eos_and_context_length(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path)
    model = load_model(tmp_path)
    engine = Engine(model, EngineConfig(max_batch_size=4, max_model_len=20))
    free = engine.generate(
        [GenerateInput([5, 6, 7], SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True))]
    )[0]
    stop_at = free.token_ids[3]
    stopped = engine.generate(
        [
            GenerateInput(
                [5, 6, 7], SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=[stop_at], ignore_eos=True)
            )
        ]
    )[0]
    assert stopped.finish_reason == FinishReason.STOP
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    long = engine.generate(
        [GenerateInput([5, 6, 7], SamplingParams(max_new_tokens=100, temperature=0.0, ignore_eos=True))]
    )[0]
    assert long.finish_reason == FinishReason.CONTEXT
    assert len(long.token_ids) + 3 == 20


def test_bad_requests_fail_alone(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path)
    engine = Engine(load_model(tmp_path), EngineConfig(max_batch_size=4, max_model_len=32))
    params = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    outs = engine.generate(
        [
            GenerateInput([], params),
            GenerateInput([4] * 40, params),
            GenerateInput([4, 500, -1], params),
            GenerateInput([4, 5], params),
        ]
    )
    assert [o.finish_reason for o in outs] == [FinishReason.ERROR] * 3 + [FinishReason.LENGTH]
    assert "empty prompt" in outs[0].error
    assert "context length is 32" in outs[1].error
    assert "out of the vocabulary" in outs[2].error and "500" in outs[2].error
    assert len(outs[3].token_ids) == 5


def test_inputs_of_the_wrong_type_are_refused_before_anything_is_queued(tmp_path):
    """Prompt ids that are not integers, params that are not SamplingParams, a non-string or repeated request id:
    one ValueError naming the request, raised by add_request (they broke inside step() and left the engine with
    requests that then came back as finished with other requests' tokens); a generate call with one bad input
    queues none of the others; numpy integers are taken as ints."""
    import numpy as np

    make_hf_model("llama").save_pretrained(tmp_path)
    engine = Engine(load_model(tmp_path), EngineConfig(max_batch_size=4, max_model_len=32))
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    good = GenerateInput([4, 5, 6], params, "good")
    reference = engine.generate([good])[0].token_ids
    bad_inputs = [
        (
            np.array([4.0, 5.0], dtype=np.float32),
            params,
            "a",
            r"request 'a': prompt ids must be integers, got np.float32\(4.0\)",
        ),
        ([4, 5.7], params, "b", r"request 'b': prompt ids must be integers, got 5.7"),
        ([True, 5], params, "c", r"request 'c': prompt ids must be integers, got True"),
        ("4 5", params, "d", r"request 'd': prompt ids must be a sequence of integers, got str"),
        ([4, 5], {"max_new_tokens": 4}, "e", r"request 'e': params must be a SamplingParams, got dict"),
        ([4, 5], params, 7, r"a request id must be a string, got int"),
    ]
    for prompt, bad_params, request_id, message in bad_inputs:
        with pytest.raises(ValueError, match=message):
            engine.add_request(prompt, bad_params, request_id)
        with pytest.raises(ValueError, match=message):
            engine.generate([good, GenerateInput(prompt, bad_params, request_id)])
        assert not engine.has_unfinished()  # nothing of the refused call was queued
    with pytest.raises(ValueError, match=r"request ids \['x'\] appear more than once"):
        engine.generate([GenerateInput([4], params, "x"), GenerateInput([5], params, "x")])
    assert not engine.has_unfinished()
    outs = engine.generate([good, GenerateInput(np.array([4, 5, 6]), params, "numpy")])
    assert outs[0].token_ids == outs[1].token_ids == reference and outs[1].prompt_ids == [4, 5, 6]
    assert all(type(t) is int for t in outs[1].prompt_ids)
    engine.add_request([4, 5], params, "req-0")  # a caller's id in the engine's own form
    assert engine.add_request([4, 5], params) != "req-0"


def test_streaming_api_reports_progress(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path)
    engine = Engine(load_model(tmp_path), EngineConfig(max_batch_size=2))
    rid = engine.add_request([3, 4, 5], SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))
    seen = []
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == rid
            seen += out.new_token_ids
            last = out
    assert last.finished and seen == last.token_ids and len(seen) == 4
    assert last.timings.latency is not None and last.timings.latency >= last.timings.time_to_first_token >= 0


def test_hidden_states_on_request(tmp_path):
    hf = make_hf_model("llama")
    hf.save_pretrained(tmp_path)
    engine = Engine(load_model(tmp_path), EngineConfig(max_batch_size=2))
    prompt = [3, 4, 5, 6]
    out = engine.generate(
        [
            GenerateInput(
                prompt, SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True), return_hidden_states=True
            )
        ]
    )[0]
    assert out.hidden_states.shape == (6, 64)
    full = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        ref = hf.model(full).last_hidden_state[0]
    # Token i was produced by the hidden state at position len(prompt) - 1 + i.
    torch.testing.assert_close(out.hidden_states, ref[len(prompt) - 1 : len(prompt) - 1 + 6], atol=1e-4, rtol=0)


def test_generation_config_eos_ids_stop_as_in_transformers(tmp_path):
    """Chat models keep their end-of-turn id in generation_config.json only (Llama-3-Instruct's <|eot_id|>), and
    transformers' generate stops on it: so does the engine (it ran on to max_new_tokens)."""
    hf = make_hf_model("llama")
    prompt = [5, 9, 14, 3]
    free, _ = _hf_greedy(hf, prompt, 12)
    stop = free[3]  # a token greedy decoding reaches, not the config's EOS
    hf.generation_config.eos_token_id = [2, stop]
    hf.save_pretrained(tmp_path)
    engine = Engine(load_model(tmp_path), EngineConfig(max_batch_size=1, max_model_len=64))
    out = engine.generate([GenerateInput(prompt, SamplingParams(max_new_tokens=12, temperature=0.0))])[0]
    want = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 4, dtype=torch.long), max_new_tokens=12,
                       do_sample=False, pad_token_id=0)[0, 4:].tolist()  # fmt: skip
    assert out.token_ids == want == free[: free.index(stop) + 1] and out.finish_reason == FinishReason.STOP
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "x"}')
    with pytest.raises(ValueError, match="generation_config.json: eos_token_id must be a token id"):
        load_model(tmp_path)
