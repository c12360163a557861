"""First-mismatch judgement: a swap of the two best perturbed tokens is a near-tie only under a bound above their
gap; a token the processed distribution excludes, or a stop in one run only, is always a bug; equal tokens' log-probs
are judged by the request's dtype and temperature."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from fastrl.engine.engine import GenerateInput
from fastrl.engine.request import FinishReason, RequestOutput, Timings
from fastrl.exactness.compare import compare_runs
from fastrl.exactness.mismatch import MISSING, analyse_mismatch, first_difference, logprob_tolerance, near_tie_bound
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.processing import process_logits
from fastrl.sampling.sampler import SamplingBatch, perturbed_logits, sampling_noise
from tests.rl.grpo_setup import tiny_policy


def _top2(policy, context, params, seed):
    logits = policy(torch.tensor([context]), torch.arange(len(context)).unsqueeze(0)).logits[:, -1]
    batch = SamplingBatch.from_params([params], [seed])
    perturbed = perturbed_logits(logits, batch, torch.tensor([len(context)]))[0]
    top = torch.topk(perturbed, 2)
    return top.indices.tolist(), float(top.values[0] - top.values[1]), perturbed


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 7]) == 2


@torch.inference_mode()
def test_swap_of_the_top_two_is_a_near_tie_only_below_the_bound():
    policy = tiny_policy(seed=3)
    prompt, plain = [1, 5, 9, 4], [7, 8]
    for params, seed in ((SamplingParams(temperature=0.9), 17), (SamplingParams(temperature=0.0), 0)):
        (best, second), gap, _ = _top2(policy, prompt + plain, params, seed)
        assert gap > 0
        ours, theirs = plain + [best, 3], plain + [second, 3]
        wide = analyse_mismatch(policy, prompt, ours, theirs, params, seed, bound=gap * 2)
        assert wide is not None and wide.position == 2 and wide.near_tie and wide.kind == "near-tie"
        assert (wide.plain_token, wide.spec_token) == (best, second)
        assert abs(wide.gap - gap) < 1e-5 and 0 < wide.spec_prob <= 1
        narrow = analyse_mismatch(policy, prompt, ours, theirs, params, seed, bound=gap / 2)
        assert narrow is not None and not narrow.near_tie and narrow.kind == "bug"
        assert analyse_mismatch(policy, prompt, ours, list(ours), params, seed, bound=1.0) is None


@torch.inference_mode()
def test_tokens_outside_the_filter_and_early_stops_are_bugs():
    policy = tiny_policy(seed=4)
    prompt = [1, 6, 6, 2 + 7]
    params = SamplingParams(temperature=1.0, top_k=2)
    (best, second), _, perturbed = _top2(policy, prompt, params, 5)
    excluded = int(torch.argmin(perturbed))
    m = analyse_mismatch(policy, prompt, [best], [excluded], params, 5, bound=1e-3)  # far past the top-k edge
    assert m is not None and m.kind == "bug" and m.spec_prob == 0.0 and m.gap == float("inf")
    stop = analyse_mismatch(policy, prompt, [best, 4], [best], params, 5, bound=1e9)
    assert stop is not None and stop.position == 1 and stop.spec_token == MISSING and stop.kind == "bug"


def test_bound_scales_with_temperature_and_dtype():
    assert near_tie_bound(torch.float32, 0.5) == 2 * near_tie_bound(torch.float32, 1.0)
    assert near_tie_bound(torch.float32, 0.0) == near_tie_bound(torch.float32, 1.0)
    assert near_tie_bound(torch.float64, 1.0) < near_tie_bound(torch.float32, 1.0) < near_tie_bound(torch.bfloat16, 1)


def test_equal_tokens_log_probs_are_judged_per_request_by_dtype_and_temperature():
    """A request's log-prob tolerance is its dtype's scaled by 1/T below T = 1 (sampled rows divide logits by T):
    the same 1.5e-3 difference is rounding at T = 0.5 in float32 and a bug at T = 1; an explicit tolerance is used as
    given for every request."""
    assert logprob_tolerance(torch.float32) == 1e-3 and logprob_tolerance(torch.float32, 0.5) == 2e-3
    assert logprob_tolerance(torch.bfloat16, 0.0) == logprob_tolerance(torch.bfloat16, 2.0) == 0.25
    policy = tiny_policy(seed=3)

    def output(request: int, logprobs: list[float]) -> RequestOutput:
        return RequestOutput(
            str(request), [1, 5], [7, 8], logprobs, FinishReason.LENGTH, None, request, [1], [], None, None, Timings()
        )

    temperatures = (0.5, 1.0)
    inputs = [GenerateInput([1, 5], SamplingParams(temperature=t, max_new_tokens=2)) for t in temperatures]
    plain = [output(i, [-0.5, -1.0]) for i in range(2)]
    spec = [output(i, [-0.5, -1.0015]) for i in range(2)]
    report = compare_runs(policy, inputs, plain, spec)
    assert [item.is_bug() for item in report.items] == [False, True]
    assert [item.logprob_tol for item in report.items] == [2e-3, 1e-3] and report.logprob_tol == 1e-3
    strict = compare_runs(policy, inputs, plain, spec, logprob_tol=1e-4)
    assert [item.is_bug() for item in strict.items] == [True, True] and len(strict.bugs) == 2


@torch.inference_mode()
def test_a_third_candidate_within_the_bound_of_the_best_is_a_near_tie():
    """Half precision can round a third close candidate to the top in one forward (bfloat16 SmolLM2 at T=0.7:
    perturbed 30.33, 30.07, 29.98 at the top, plain took the third): both tokens within the bound of the best is a
    near-tie, whichever two they are; one beyond it, or outside the support, is a bug. The report stays JSON."""
    policy = tiny_policy(seed=3)
    prompt, plain = [1, 5, 9, 4], [7, 8]
    params, seed = SamplingParams(temperature=0.9), 17
    logits = policy(torch.tensor([prompt + plain]), torch.arange(len(prompt) + 2).unsqueeze(0)).logits[:, -1]
    batch = SamplingBatch.from_params([params], [seed])
    perturbed = perturbed_logits(logits, batch, torch.tensor([len(prompt) + 2]))[0].double()
    order = torch.argsort(perturbed, descending=True).tolist()
    first, third = order[0], order[2]
    shortfall = float(perturbed[first] - perturbed[third])
    ours, theirs = plain + [third], plain + [first]
    wide = analyse_mismatch(policy, prompt, ours, theirs, params, seed, bound=shortfall * 1.01)
    assert wide is not None and wide.near_tie and abs(wide.gap - shortfall) < 1e-4
    narrow = analyse_mismatch(policy, prompt, ours, theirs, params, seed, bound=shortfall * 0.99)
    assert narrow is not None and not narrow.near_tie
    stopped = analyse_mismatch(policy, prompt, plain, plain + [first], params, seed, bound=1e9)
    assert stopped is not None and not stopped.near_tie and stopped.plain_token == MISSING
    assert json.loads(json.dumps(stopped.to_dict(), allow_nan=False))["gap"] is None


class FixedLogits(torch.nn.Module):
    """A stand-in policy whose next-token logits are ``row`` after any context."""

    def __init__(self, row: torch.Tensor) -> None:
        super().__init__()
        self.row = torch.nn.Parameter(row, requires_grad=False)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.row.expand(1, ids.shape[1], -1))


@torch.inference_mode()
def test_a_filtered_rows_gap_is_the_samplers_perturbed_gap_at_a_low_temperature():
    """The sampler adds its noise to the centred row; the filtered gap added it to the raw one, where a float32 row
    at T = 1e-5 (30 / 1e-5 = 3e6, a step of 0.25) rounds the noise away: the reported gap was not the sampler's."""
    row = torch.tensor([30.0, 29.999998, 29.999996, 29.999994, 0.0, -1.0, 2.0, 1.0])
    policy, prompt, seed = FixedLogits(row), [1, 2], 11
    params = SamplingParams(temperature=1e-5, top_k=4)
    batch, position = SamplingBatch.from_params([params], [seed]), torch.tensor([len(prompt)])
    perturbed = perturbed_logits(row.unsqueeze(0), batch, position)[0].double()
    order = torch.argsort(perturbed, descending=True).tolist()
    bound = near_tie_bound(torch.float32, params.temperature)
    scaled = process_logits(row.unsqueeze(0), batch.temperature, batch.top_k, batch.top_p, apply_filters=False)
    uncentred = (scaled + sampling_noise(batch, position, row.numel()))[0].double()
    for other in order[1:4]:
        want = float(perturbed[order[0]]) - float(perturbed[other])
        m = analyse_mismatch(policy, prompt, [order[0]], [other], params, seed, bound)
        assert m is not None and m.gap == want and m.near_tie == (want < bound)
        assert float(uncentred[order[:4]].max()) - float(uncentred[other]) != want  # the old arithmetic's gap


def test_a_row_both_runs_end_on_non_finite_logits_is_equal_and_its_report_is_strict_json():
    """The token of a row both runs ended on non-finite logits carries a NaN log-prob in each: equal. A NaN beside a
    number is a bug, and the report of it stays strict JSON (no NaN or Infinity literals)."""
    policy = tiny_policy(seed=3)

    def output(request: int, logprobs: list[float]) -> RequestOutput:
        reason, error = FinishReason.ERROR, f"request {request}: non-finite logits at generated token 1"
        return RequestOutput(
            str(request), [1, 5], [7, 8], logprobs, reason, error, request, [1], [], None, None, Timings()
        )

    inputs = [GenerateInput([1, 5], SamplingParams(temperature=1.0, max_new_tokens=2)) for _ in range(3)]
    nan, inf = float("nan"), float("inf")
    plain = [output(0, [-0.5, nan]), output(1, [-0.5, nan]), output(2, [-inf, -1.0])]
    spec = [output(0, [-0.5, nan]), output(1, [-0.5, -1.0]), output(2, [-inf, -1.0])]
    report = compare_runs(policy, inputs, plain, spec)
    assert [item.is_bug() for item in report.items] == [False, True, False]
    assert [item.logprob_diff for item in report.items] == [0.0, inf, 0.0]
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["max_logprob_diff"] is None and data["items"][0]["logprob_diff"] is None and data["bugs"] == 1


def test_a_log_prob_list_cut_short_or_an_error_in_one_run_is_a_bug():
    """Equal tokens are not enough: a run that lost log-probs (a list shorter than its tokens, or empty) or ended a
    request with an error the other run did not give (with the same finish reason) is a bug, whichever run it is."""
    policy = tiny_policy(seed=3)

    def output(logprobs: list[float], error: str | None = None) -> RequestOutput:
        reason = FinishReason.LENGTH
        return RequestOutput("r", [1, 5], [7, 8, 9], logprobs, reason, error, 0, [1, 1], [], None, None, Timings())

    inputs = [GenerateInput([1, 5], SamplingParams(temperature=1.0, max_new_tokens=3))]
    full = output([-0.5, -1.0, -0.25])
    cases = {
        "identical": (full, output([-0.5, -1.0, -0.25]), False),
        "spec short": (full, output([-0.5, -1.0]), True),
        "spec empty": (full, output([]), True),
        "plain short": (output([-0.5]), full, True),
        "spec error": (full, output([-0.5, -1.0, -0.25], "request r: something"), True),
        "plain error": (output([-0.5, -1.0, -0.25], "request r: x"), full, True),
        "other error": (output([-0.5, -1.0, -0.25], "request r: x"), output([-0.5, -1.0, -0.25], "request r: y"), True),
    }
    for name, (plain, spec, bug) in cases.items():
        (item,) = compare_runs(policy, inputs, [plain], [spec]).items
        assert item.is_bug() == bug, name
