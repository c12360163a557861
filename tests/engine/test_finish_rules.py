"""The finish rules decided in tensors (`fastrl.engine.finish`) give what the one-token-at-a-time rules give
(the engine's rules before them, restated here as the reference), on random cases; and an engine whose
requests stop on EOS, stop ids, length and context emits what those rules say."""

from __future__ import annotations

import math
import random

import pytest
import torch

from fastrl.engine.batch import SlotState
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.engine.finish import FINISH_CODES
from fastrl.engine.request import FinishReason, Request
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from tests.helpers import make_hf_model

VOCAB = 12
EOS = 2


def _one_token_at_a_time(request: Request, tokens: list[int], logprobs: list[float], max_model_len: int):
    """What the engine did before: append token by token, stop at the first that finishes the request."""
    params = request.params
    for n, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True), start=1):
        request.output_ids.append(token)
        if not math.isfinite(logprob):
            return n, FinishReason.ERROR
        if token in params.stop_token_ids or (not params.ignore_eos and token == EOS):
            return n, FinishReason.STOP
        if len(request.output_ids) >= params.max_new_tokens:
            return n, FinishReason.LENGTH
        if request.num_tokens >= max_model_len:
            return n, FinishReason.CONTEXT
    return len(tokens), None


@pytest.mark.parametrize("seed", range(4))
def test_finish_rules_in_tensors_match_the_token_by_token_rules(seed):
    rng = random.Random(seed)
    max_model_len = rng.randint(20, 40)
    rows, k = 64, rng.randint(1, 6)
    tokens = torch.tensor([[rng.randrange(VOCAB) for _ in range(k)] for _ in range(rows)])
    logprobs = torch.tensor(
        [[rng.choice([-0.5, -1.0, -2.0, -2.0, -3.0, math.nan, -math.inf]) for _ in range(k)] for _ in range(rows)]
    )
    candidates = torch.tensor([rng.randint(1, k) for _ in range(rows)])
    requests, before = [], []
    for row in range(rows):
        params = SamplingParams(
            max_new_tokens=rng.randint(1, 12),
            stop_token_ids=rng.sample(range(VOCAB + 3), rng.randint(0, 3)),  # ids past the vocabulary: never met
            ignore_eos=rng.random() < 0.5,
        )
        prompt = [5] * rng.randint(1, max_model_len - 2)
        request = Request(f"r{row}", prompt, params, seed=0)
        request.output_ids = [7] * rng.randint(0, min(params.max_new_tokens - 1, max_model_len - len(prompt) - 1))
        request.slot = rows - 1 - row  # slots in another order than the rows
        requests.append(request)
        before.append(request.num_tokens)
    # the rules as an engine applies them: each request's stop ids and EOS in its slot of the batch state
    state = SlotState(rows + 1, torch.device("cpu"), max_model_len, VOCAB, (EOS,))
    slots = state.admit(requests, before)
    finish = state.finish(slots, tokens, logprobs, candidates, torch.tensor(before))
    for row, request in enumerate(requests):
        count = int(candidates[row])
        expected = _one_token_at_a_time(
            request, tokens[row, :count].tolist(), logprobs[row, :count].tolist(), max_model_len
        )
        code = int(finish.code[row])
        assert (int(finish.emitted[row]), FINISH_CODES.get(code)) == expected, (row, request)


def test_a_slot_readmitted_forgets_the_stop_ids_of_its_last_request():
    state = SlotState(3, torch.device("cpu"), 64, VOCAB, (EOS,))
    tokens, logprobs, one = torch.tensor([[3], [EOS]]), torch.zeros(2, 1), torch.ones(2, dtype=torch.long)

    def codes(*params: SamplingParams) -> list[int]:
        requests = [Request(f"q{i}", [5, 6], p, seed=0) for i, p in enumerate(params)]
        for slot, request in enumerate(requests):
            request.slot = slot
        slots = state.admit(requests, [2, 2])
        return state.finish(slots, tokens, logprobs, one, torch.tensor([2, 2])).code.tolist()

    assert codes(SamplingParams(stop_token_ids=[3]), SamplingParams()) == [2, 2]
    assert codes(SamplingParams(ignore_eos=True), SamplingParams(ignore_eos=True, stop_token_ids=[4])) == [0, 0]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", seed=3).save_pretrained(path)
    return load_model(path)


def test_engine_outputs_stop_where_the_rules_say(model):
    """EOS, stop ids, max_new_tokens and the context length end requests at the first token that meets them."""
    max_model_len = 40
    engine = Engine(model, EngineConfig(max_batch_size=8, max_model_len=max_model_len))
    eos = model.config.eos_token_id
    rng = random.Random(5)
    inputs = []
    for i in range(16):
        params = SamplingParams(
            max_new_tokens=rng.randint(1, 40),
            temperature=1.0,
            seed=i,
            stop_token_ids=rng.sample(range(3, model.config.vocab_size), 2),
            ignore_eos=i % 3 == 0,
        )
        inputs.append(
            GenerateInput([rng.randrange(3, model.config.vocab_size) for _ in range(rng.randint(1, 30))], params)
        )
    outputs = engine.generate(inputs)
    assert {o.finish_reason for o in outputs} == {FinishReason.STOP, FinishReason.LENGTH, FinishReason.CONTEXT}
    for out, given in zip(outputs, inputs, strict=True):
        params, tokens = given.params, out.token_ids
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else {eos})
        assert not any(t in stops for t in tokens[:-1])  # nothing stopped before the last token
        total = len(given.prompt_ids) + len(tokens)
        if out.finish_reason == FinishReason.STOP:
            assert tokens[-1] in stops
        elif out.finish_reason == FinishReason.LENGTH:
            assert len(tokens) == params.max_new_tokens and total <= max_model_len
        else:
            assert out.finish_reason == FinishReason.CONTEXT and total == max_model_len
        assert len(out.logprobs) == len(tokens) and sum(out.accept_lengths) + 1 == len(tokens)
