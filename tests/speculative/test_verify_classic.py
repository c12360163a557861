"""Classic speculative sampling: emitted tokens are distributed as the target, for adversarial drafters."""

import pytest
import torch

from fastrl.sampling.goodness_of_fit import chi_square_test
from fastrl.sampling.noise import SAMPLE_STREAM, gumbel_noise
from fastrl.speculative.verify_classic import count_accepted, emission_weights, verify_classic

NUM_CHAINS = 20000


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(-1, keepdim=True)


def _draft(q: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    # [B,K,V] drafter probs -> [B,K] drafts, sampled with the drafter's (main) stream, independent of the verifier
    b, k, vocab = q.shape
    flat_positions = (positions[:, None] + torch.arange(k)[None, :]).reshape(-1)
    noise = gumbel_noise(seeds.repeat_interleave(k), flat_positions, vocab, stream=SAMPLE_STREAM).view(b, k, vocab)
    return (q.log() + noise).argmax(-1)


def _settings() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)

    def rand(vocab: int) -> torch.Tensor:
        return _normalise(torch.rand(vocab, generator=gen) ** 2 + 0.01)

    p8 = rand(8)
    rare = int(p8.argmin())
    peaked_on_rare = _normalise(torch.full((8,), 0.01).index_fill(0, torch.tensor([rare]), 1.0))
    half = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0])
    p_zeros = _normalise(torch.tensor([0.0, 2, 0, 1, 3, 0]))
    return {
        "q_equals_p": (rand(6), None),
        "q_uniform": (rand(10), torch.full((10,), 0.1)),
        "q_peaked_on_rare_token": (p8, peaked_on_rare),
        "disjoint_supports": (_normalise(half), _normalise(1 - half)),
        "q_zero_where_p_positive": (rand(5), _normalise(torch.tensor([0.0, 1.0, 0.0, 2.0, 1.0]))),
        "p_zero_where_q_positive": (p_zeros, rand(6)),
        "p_one_hot": (torch.eye(7)[3], rand(7)),
        "q_one_hot_elsewhere": (rand(4), torch.eye(4)[0]),
        "both_random_v16": (rand(16), rand(16)),
        "q_flatter_than_p": (_normalise(torch.arange(1.0, 13.0) ** 3), _normalise(torch.arange(1.0, 13.0))),
        "q_sharper_than_p": (_normalise(torch.arange(1.0, 13.0)), _normalise(torch.arange(1.0, 13.0) ** 3)),
        "p_uniform_q_random": (torch.full((9,), 1 / 9), rand(9)),
    }


SETTINGS = _settings()


@pytest.mark.parametrize("num_drafts", [1, 3])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_first_emitted_token_is_distributed_as_target(name, num_drafts):
    p, q = SETTINGS[name]
    q = p.clone() if q is None else q
    vocab = p.numel()
    target = p.expand(NUM_CHAINS, num_drafts + 1, vocab)
    draft = q.expand(NUM_CHAINS, num_drafts, vocab)
    seeds = torch.arange(NUM_CHAINS) * 7919 + 1
    positions = torch.full((NUM_CHAINS,), 50)
    drafts = _draft(draft, seeds, positions)
    result = verify_classic(target, draft, drafts, seeds, positions)
    assert ((result.accepted >= 0) & (result.accepted <= num_drafts)).all()
    first = result.tokens[:, 0]
    test = chi_square_test(torch.bincount(first, minlength=vocab), p)
    assert test.impossible == 0, name
    assert test.p_value > 1e-3, (name, test)
    if name == "q_equals_p":
        assert (result.accepted == num_drafts).all()
    if name == "disjoint_supports":
        assert (result.accepted == 0).all()


def _markov(seed: int, vocab: int, sharpness: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return _normalise(torch.rand(vocab, vocab, generator=gen) ** sharpness + 0.02)


def test_joint_distribution_of_first_two_emitted_tokens():
    # target P(next | prev) and drafter Q(next | prev) are different first-order Markov chains
    vocab, k, n = 4, 2, 40000
    target_chain, draft_chain = _markov(1, vocab, 3.0), _markov(2, vocab, 1.0)
    context = torch.zeros(n, dtype=torch.int64)
    seeds = torch.arange(n) + 10**6
    start = torch.full((n,), 30)

    def round_from(prev: torch.Tensor, pos: torch.Tensor):
        # draft K tokens from Q along the chain, then verify them against P evaluated on the drafted prefix
        tokens, q_rows, p_rows = [], [], [target_chain[prev]]
        last = prev
        for step in range(k):
            q_row = draft_chain[last]
            noise = gumbel_noise(seeds, pos + step, vocab, stream=SAMPLE_STREAM)
            last = (q_row.log() + noise).argmax(-1)
            tokens.append(last)
            q_rows.append(q_row)
            p_rows.append(target_chain[last])
        return verify_classic(torch.stack(p_rows, 1), torch.stack(q_rows, 1), torch.stack(tokens, 1), seeds, pos)

    first_round = round_from(context, start)
    e0 = first_round.tokens[:, 0]
    second_round = round_from(e0, start + 1)  # used only by chains that emitted a single token in round one
    e1 = torch.where(first_round.accepted >= 1, first_round.tokens[:, 1], second_round.tokens[:, 0])
    expected = target_chain[0][:, None] * target_chain
    test = chi_square_test(torch.bincount(e0 * vocab + e1, minlength=vocab * vocab), expected.flatten())
    assert test.impossible == 0 and test.p_value > 1e-3, test
    assert (first_round.accepted == 0).any() and (first_round.accepted == k).any()


def test_expected_accept_length_matches_theory():
    vocab, k, n = 6, 4, 40000
    gen = torch.Generator().manual_seed(3)
    p = _normalise(torch.rand(vocab, generator=gen) + 0.1)
    q = _normalise(torch.rand(vocab, generator=gen) + 0.1)
    alpha = torch.minimum(p, q).sum().item()
    theory = sum(alpha**j for j in range(1, k + 1))
    seeds, positions = torch.arange(n), torch.full((n,), 5)
    draft = q.expand(n, k, vocab)
    result = verify_classic(p.expand(n, k + 1, vocab), draft, _draft(draft, seeds, positions), seeds, positions)
    lengths = result.accepted.double()
    stderr = lengths.std().item() / n**0.5
    assert abs(lengths.mean().item() - theory) < 4 * stderr, (lengths.mean().item(), theory, stderr)
    for j in range(1, k + 1):  # P(accept_length >= j) = alpha ** j
        frac = (lengths >= j).double().mean().item()
        assert abs(frac - alpha**j) < 4 * (alpha**j * (1 - alpha**j) / n) ** 0.5 + 1e-9


def test_accept_rule_edge_cases_without_nan():
    target = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])
    draft = torch.tensor([[[0.0, 0.5, 0.5]]])
    u = torch.tensor([[0.999999]])
    # q(x) = 0 < p(x): always accepted
    assert count_accepted(target, draft, torch.tensor([[0]]), u).tolist() == [1]
    # p(x) = 0 < q(x): always rejected, even for the smallest uniform
    assert count_accepted(target, draft, torch.tensor([[2]]), torch.tensor([[1e-9]])).tolist() == [0]
    # p(x) = q(x) = 0 (an adversarial draft that was not sampled from q): rejected
    zero = torch.tensor([[[0.0, 1.0, 0.0]]])
    assert count_accepted(torch.cat([zero, zero], 1), zero, torch.tensor([[0]]), torch.tensor([[1e-9]])).tolist() == [0]


def test_empty_residual_falls_back_to_target():
    # p == q everywhere: after a (forced) rejection the residual has no mass, so the token comes from p
    p = torch.tensor([0.0, 0.6, 0.4, 0.0])
    target, draft = p.expand(NUM_CHAINS, 2, 4), p.expand(NUM_CHAINS, 1, 4)
    weights = emission_weights(target, draft, torch.zeros(NUM_CHAINS, dtype=torch.int64))
    assert torch.equal(weights, target[:, 0])
    seeds, positions = torch.arange(NUM_CHAINS), torch.zeros(NUM_CHAINS, dtype=torch.int64)
    result = verify_classic(target, draft, torch.zeros(NUM_CHAINS, 1, dtype=torch.int64), seeds, positions)
    assert (result.accepted == 0).all()
    test = chi_square_test(torch.bincount(result.next_tokens, minlength=4), p)
    assert test.impossible == 0 and test.p_value > 1e-3


def test_bonus_token_comes_from_the_last_target_row():
    target = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]])
    draft = torch.tensor([[[0.5, 0.5, 0.0]]])
    weights = emission_weights(target, draft, torch.tensor([1]))
    assert torch.equal(weights, target[:, 1])
    result = verify_classic(target, draft, torch.tensor([[1]]), torch.tensor([3]), torch.tensor([9]))
    assert result.accepted.tolist() == [1]
    assert result.tokens.tolist() == [[1, 2]] and result.next_tokens.tolist() == [2]


def test_token_layout_reproducibility_and_row_independence():
    gen = torch.Generator().manual_seed(4)
    b, k, vocab = 64, 3, 10
    target = _normalise(torch.rand(b, k + 1, vocab, generator=gen))
    draft = _normalise(torch.rand(b, k, vocab, generator=gen))
    seeds, positions = torch.arange(b) + 100, torch.arange(b) * 5
    drafts = _draft(draft, seeds, positions)
    result = verify_classic(target, draft, drafts, seeds, positions)
    again = verify_classic(target, draft, drafts, seeds, positions)
    assert torch.equal(result.tokens, again.tokens)
    for row in range(b):
        n = int(result.accepted[row])
        assert result.tokens[row, :n].tolist() == drafts[row, :n].tolist()
        assert int(result.tokens[row, n]) == int(result.next_tokens[row])
        assert (result.tokens[row, n + 1 :] == -1).all()
    for row in (0, 17, 63):
        alone = verify_classic(
            target[row : row + 1],
            draft[row : row + 1],
            drafts[row : row + 1],
            seeds[row : row + 1],
            positions[row : row + 1],
        )
        assert torch.equal(alone.tokens[0], result.tokens[row])
    assert len(set(result.accepted.tolist())) > 1


def test_zero_drafts_samples_from_target():
    p = torch.tensor([0.1, 0.2, 0.7])
    n = NUM_CHAINS
    result = verify_classic(
        p.expand(n, 1, 3),
        torch.empty(n, 0, 3),
        torch.empty(n, 0, dtype=torch.int64),
        torch.arange(n),
        torch.zeros(n, dtype=torch.int64),
    )
    assert (result.accepted == 0).all()
    assert chi_square_test(torch.bincount(result.next_tokens, minlength=3), p).p_value > 1e-3
