"""The reduced draft vocabulary: outputs never change, the drafter only proposes its K tokens, the map survives
a checkpoint round trip, the restricted head follows policy weight updates, and bad maps are clear errors."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.draft_vocab import coverage, most_frequent_tokens
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import DRAFT_VOCAB_FILE, load_drafter, save_drafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    make_hf_model("qwen3", seed=2).save_pretrained(path)
    return load_model(path)


def _inputs(vocab: int, seed: int) -> list[GenerateInput]:
    rng = random.Random(seed)
    return [
        GenerateInput(
            [rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))],
            SamplingParams(max_new_tokens=20, temperature=rng.choice([0.0, 0.8, 1.2]), seed=i, ignore_eos=True),
        )
        for i in range(6)
    ]


@pytest.mark.parametrize("strategy", ["3_1_4", "4_3_10"])
@pytest.mark.parametrize("size", [8, 40])
def test_outputs_equal_plain_and_drafts_stay_inside(model, strategy, size):
    vocab = model.config.vocab_size
    torch.manual_seed(1)
    drafter = EagleDrafter(model.config)
    ids = torch.tensor(sorted(random.Random(size).sample(range(vocab), size)))
    drafter.set_draft_vocab(ids)
    inputs = _inputs(vocab, size)
    plain = Engine(model, EngineConfig(max_batch_size=6)).generate(inputs)
    engine = Engine(model, EngineConfig(max_batch_size=6), drafter=drafter, selector=FixedSelector(strategy))
    proposed: list[torch.Tensor] = []
    original = engine.runner.drafter.draft_logits

    def spy(policy, feature):
        logits = original(policy, feature)
        assert logits.shape[-1] == size
        return logits

    engine.runner.drafter.draft_logits = spy
    spec = engine.generate(inputs)
    for a, b in zip(plain, spec, strict=True):
        assert a.token_ids == b.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
    # Every accepted draft token is a draft-vocabulary token: accepted drafts precede each round's policy token
    # (token 0 comes from the prefill, then one accept_lengths entry per decode round).
    allowed = set(ids.tolist())
    for out in spec:
        position = 1
        for n in out.accept_lengths:
            proposed.extend(out.token_ids[position : position + n - 1])
            position += n
    assert set(proposed) <= allowed


def test_checkpoint_round_trip(model, tmp_path):
    drafter = EagleDrafter(model.config)
    drafter.set_draft_vocab(torch.tensor([5, 3, 9, 40]))
    save_drafter(drafter, tmp_path / "d", "tiny", dtype="bfloat16")
    loaded, info = load_drafter(tmp_path / "d", model)
    assert info.draft_vocab_size == 4
    assert loaded.draft_vocab.tolist() == [5, 3, 9, 40]
    assert (tmp_path / "d" / "drafter.safetensors").stat().st_size < 2 * sum(
        p.numel() for p in drafter.parameters()
    ) + 4096  # bf16 on disk
    drafter.set_draft_vocab(None)
    save_drafter(drafter, tmp_path / "d", "tiny")
    assert not (tmp_path / "d" / DRAFT_VOCAB_FILE).exists()
    assert load_drafter(tmp_path / "d", model)[0].draft_vocab is None


def test_corrupt_map_is_named(model, tmp_path):
    from safetensors.torch import save_file

    drafter = EagleDrafter(model.config)
    drafter.set_draft_vocab(torch.tensor([1, 2, 3]))
    save_drafter(drafter, tmp_path / "d", "tiny")
    save_file({"ids": torch.tensor([1, 1, 2])}, str(tmp_path / "d" / DRAFT_VOCAB_FILE))
    with pytest.raises(ValueError, match=DRAFT_VOCAB_FILE):
        load_drafter(tmp_path / "d", model)
    (tmp_path / "d" / DRAFT_VOCAB_FILE).unlink()
    with pytest.raises(ValueError, match="is missing"):
        load_drafter(tmp_path / "d", model)
    save_drafter(EagleDrafter(model.config), tmp_path / "full", "tiny")  # a map its config does not name
    save_file({"ids": torch.tensor([1, 2, 3])}, str(tmp_path / "full" / DRAFT_VOCAB_FILE))
    with pytest.raises(ValueError, match=f"{DRAFT_VOCAB_FILE} is there but drafter_config.json has no draft_vocab"):
        load_drafter(tmp_path / "full", model)


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.tensor([0, 1, 1]), "distinct"),
        (torch.tensor([0, 10_000]), "lie in"),
        (torch.tensor([[0, 1]]), "1-D"),
        (torch.tensor([0.0, 1.0]), "integer"),
    ],
)
def test_bad_maps(model, ids, message):
    with pytest.raises(ValueError, match=message):
        EagleDrafter(model.config).set_draft_vocab(ids)


def test_topk_wider_than_the_map_is_refused(model):
    drafter = EagleDrafter(model.config)
    drafter.set_draft_vocab(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="draft vocabulary"):
        Engine(model, EngineConfig(max_batch_size=2), drafter=drafter, selector=FixedSelector("3_4_8"))


def test_restricted_head_follows_policy_updates(model):
    drafter = EagleDrafter(model.config)
    drafter.set_draft_vocab(torch.tensor([4, 7, 11]))
    feature = torch.randn(2, model.config.hidden_size)
    with torch.inference_mode():
        before = drafter.draft_logits(model, feature)
        full = model.logits(feature)[:, [4, 7, 11]]
        assert torch.allclose(before, full, atol=1e-6)
        with torch.no_grad():
            model.lm_head.weight.mul_(2.0)
        after = drafter.draft_logits(model, feature)
        with torch.no_grad():
            model.lm_head.weight.mul_(0.5)
    assert torch.allclose(after, 2.0 * before, atol=1e-6)


def test_most_frequent_tokens():
    seqs = [[5, 5, 5, 2, 2, 9], [9, 9, 9, 9, 1]]
    assert most_frequent_tokens(seqs, 2, 12).tolist() == [5, 9]
    assert most_frequent_tokens(seqs, 4, 12).tolist() == [1, 2, 5, 9]
    # unseen ids fill by ascending id, and the result is a pure function of the counts
    assert most_frequent_tokens(seqs, 6, 12).tolist() == [0, 1, 2, 3, 5, 9]
    assert most_frequent_tokens(list(reversed(seqs)), 6, 12).tolist() == [0, 1, 2, 3, 5, 9]
    assert coverage(seqs, torch.tensor([5, 9])) == pytest.approx(8 / 11)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        most_frequent_tokens(seqs, 0, 12)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        most_frequent_tokens([[12]], 1, 12)


def _feature_batch(model, seed: int):
    from fastrl.cotrain.feature_sequence import FeatureBatch, FeatureSequence

    gen = torch.Generator().manual_seed(seed)
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    seqs = [
        FeatureSequence(torch.randint(0, vocab, (n,), generator=gen), torch.randn(n, hidden, generator=gen), 1)
        for n in (5, 9, 3)
    ]
    return FeatureBatch.collate(seqs, target_size=hidden)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_loss_is_taken_over_the_draft_vocabulary(model, seed):
    import torch.nn.functional as F

    from fastrl.cotrain.eagle_loss import eagle_loss

    torch.manual_seed(seed)
    drafter = EagleDrafter(model.config)
    batch = _feature_batch(model, seed)
    vocab = model.config.vocab_size
    full = eagle_loss(drafter, model, batch)
    # The whole vocabulary in another order is the same distribution: the same loss.
    drafter.set_draft_vocab(torch.randperm(vocab, generator=torch.Generator().manual_seed(seed)))
    permuted = eagle_loss(drafter, model, batch)
    assert torch.allclose(permuted.total, full.total, rtol=1e-5) and torch.isclose(permuted.top1, full.top1)
    # A subset: the token term is the cross-entropy of the two distributions restricted to it.
    ids = torch.tensor(sorted(random.Random(seed).sample(range(vocab), 12)))
    drafter.set_draft_vocab(ids)
    with torch.inference_mode():  # a decode round builds the drafter's cached head in inference mode
        drafter.draft_logits(model, torch.zeros(1, model.config.hidden_size))
    restricted = eagle_loss(drafter, model, batch)
    restricted.total.backward()  # the loss must not use the inference-mode cached head
    assert drafter.fc.weight.grad is not None
    with torch.no_grad():
        pred = drafter(model, batch.tokens, batch.features, batch.positions)[batch.mask]
        head = model.lm_head.weight[ids]
        target = F.softmax(batch.targets[batch.mask] @ head.T, dim=-1)
        token = -(target * F.log_softmax(pred @ head.T, dim=-1)).sum(-1).mean()
    assert torch.allclose(restricted.token, token, rtol=1e-5)
    assert not torch.allclose(restricted.token, full.token, rtol=1e-3)


def test_a_new_vocabulary_of_the_same_size_goes_into_the_live_tensors(model):
    """CUDA graphs read the draft vocabulary and the restricted head by address: a pushed vocabulary (a resumed or
    replacement worker's) replaced both, and the captured graphs went on reading the old, freed ones. One of the
    live size is copied in place now, the head refreshed in place from the new rows; another size, or a move to
    another device, still replaces them."""
    vocab = model.config.vocab_size
    drafter = EagleDrafter(model.config)
    drafter.set_draft_vocab(torch.arange(10))
    live, head = drafter.draft_vocab, drafter.draft_head(model)
    new = torch.tensor(random.Random(3).sample(range(vocab), 10))
    drafter.set_draft_vocab(new)
    assert drafter.draft_vocab.data_ptr() == live.data_ptr() and torch.equal(drafter.draft_vocab, new)
    refreshed = drafter.draft_head(model)
    assert refreshed.data_ptr() == head.data_ptr()
    assert torch.equal(refreshed, model.lm_head.weight.detach()[new])
    drafter.set_draft_vocab(torch.arange(12))
    assert drafter.draft_vocab.data_ptr() != live.data_ptr() and drafter.draft_head(model).shape[0] == 12


def test_moving_the_models_drops_the_restricted_head(model):
    """release_memory(["weights"]) moves the models to the CPU; the restricted head, a cache outside the module's
    tensors, was dropped by re-setting the vocabulary, until a vocabulary of the same size came to be copied in
    place: the head stayed on the GPU while its bytes were counted as freed. It is dropped explicitly now."""
    from fastrl.engine.runner import ModelRunner
    from fastrl.strategy.strategy import Strategy

    drafter = EagleDrafter(model.config)
    drafter.set_draft_vocab(torch.arange(0, model.config.vocab_size, 2))
    runner = ModelRunner(model, EngineConfig(max_batch_size=2, max_model_len=64), drafter, [Strategy.parse("3_2_6")])
    ids = drafter.draft_vocab.clone()
    assert drafter.draft_head(model) is not None
    runner._move_models(torch.device("cpu"))  # what a release does on a GPU, and a restore back
    assert drafter.cached_head() is None and torch.equal(drafter.draft_vocab, ids)
    assert torch.equal(drafter.draft_head(model), model.lm_head.weight.detach()[ids])
