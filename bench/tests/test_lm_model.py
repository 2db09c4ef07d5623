"""The language-model policy: KV-cached batched sampling reproduces full recomputation exactly (padding
and early stops included), token log-probabilities and the token-level policy loss are what their
formulas say, and sampling draws from softmax(logits / T)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bench.lm.grpo import group_advantages, pad_batch, token_policy_loss
from bench.lm.model import ModelConfig, TinyLM, sample_reference

VOCAB = 20
NEVER = -1  # a stop id no sequence emits


def random_model(seed: int = 0, n_layers: int = 2) -> TinyLM:
    """A tiny model with weights far from the small initialisation, whose greedy continuations vary
    instead of repeating the last token."""
    torch.manual_seed(seed)
    model = TinyLM(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=n_layers, n_heads=4, max_len=64))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0.0, 0.3 if parameter.dim() >= 2 else 0.1)
            if "norm" in name and name.endswith("weight"):
                parameter.add_(1.0)
    return model


def random_prefixes(lengths: list[int], seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (length,), generator=generator).tolist() for length in lengths]


def test_parameter_count_matches_the_modules() -> None:
    model = random_model(n_layers=2)
    assert model.config.parameter_count == sum(parameter.numel() for parameter in model.parameters())


def test_cached_greedy_sampling_equals_full_recomputation_with_padding_and_early_stops() -> None:
    model = random_model()
    prefixes = random_prefixes([3, 7, 1, 5, 9, 2])
    unstopped = sample_reference(model, prefixes, max_new_tokens=10, stop_id=NEVER)
    stop_id = unstopped[1][3]  # the second sequence stops at its fourth token at the latest
    reference = sample_reference(model, prefixes, max_new_tokens=10, stop_id=stop_id)
    lengths = [len(tokens) for tokens in reference]
    assert min(lengths) < 10 and max(lengths) == 10, "the case must mix early stops and full lengths"

    samples = model.sample(prefixes, max_new_tokens=10, stop_id=stop_id, greedy=True)

    assert samples.tokens == reference
    assert all(tokens[-1] == stop_id for tokens in samples.tokens if len(tokens) < 10)
    assert [len(logprobs) for logprobs in samples.logprobs] == lengths


@pytest.mark.parametrize("with_longer_neighbour", [False, True])
def test_cached_logits_equal_a_full_forward_at_every_step(with_longer_neighbour: bool) -> None:
    model = random_model()
    sequence = random_prefixes([4])[0]
    batch = [sequence, random_prefixes([9], seed=2)[0]] if with_longer_neighbour else [sequence]
    pad = max(len(prefix) for prefix in batch) - len(sequence)
    ids = torch.zeros(len(batch), pad + len(sequence), dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, prefix in enumerate(batch):
        ids[row, ids.shape[1] - len(prefix) :] = torch.tensor(prefix)
        mask[row, ids.shape[1] - len(prefix) :] = True
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    cache = model.new_cache(len(batch), capacity=ids.shape[1] + 6)

    with torch.no_grad():
        logits = model.extend(ids, positions, mask, cache)[0, pad:]
        torch.testing.assert_close(logits, model(torch.tensor([sequence]))[0], atol=1e-5, rtol=0)
        for step in range(6):
            sequence.append(int(logits[-1].argmax()))
            new_ids = torch.tensor([[sequence[-1]]] * len(batch))
            new_positions = positions[:, -1:] + 1 + step
            logits = model.extend(new_ids, new_positions, torch.ones_like(new_ids, dtype=torch.bool), cache)[
                0
            ]
            full = model(torch.tensor([sequence]))[0, -1:]
            torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)


def test_a_prefix_samples_the_same_alone_and_in_a_padded_batch() -> None:
    model = random_model(seed=3)
    prefix, *others = random_prefixes([2, 8, 5, 11])
    alone = model.sample([prefix], max_new_tokens=8, stop_id=NEVER, greedy=True, feature_dim=5)
    batched = model.sample([*others, prefix], max_new_tokens=8, stop_id=NEVER, greedy=True, feature_dim=5)

    assert batched.tokens[-1] == alone.tokens[0]
    assert batched.logprobs[-1] == pytest.approx(alone.logprobs[0], abs=1e-5)
    assert batched.features[-1] == pytest.approx(alone.features[0], abs=1e-5)
    hidden_mean = model.hidden(torch.tensor([prefix]))[0].mean(dim=0)[:5]
    assert alone.features[0] == pytest.approx(hidden_mean.tolist(), abs=1e-5)
    assert model.sample([prefix], max_new_tokens=1, stop_id=NEVER).features == [[]]


def test_token_logprobs_equal_log_softmax_gathered_by_hand() -> None:
    model = random_model(n_layers=1)
    ids, mask = pad_batch([[3, 5, 7, 2], [4, 9]])

    logprobs = model.token_logprobs(ids, mask)

    expected = torch.zeros(2, 4)
    for row, length in enumerate([4, 2]):
        full = F.log_softmax(model(ids[row : row + 1, :length])[0], dim=-1)
        for t in range(1, length):
            expected[row, t] = full[t - 1, ids[row, t]]
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)


def test_token_policy_loss_by_hand() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -math.inf]], requires_grad=True)
    advantages = torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])

    loss = token_policy_loss(logprobs, advantages, mask)
    loss.backward()

    # −(1·(−1) + (−2)·(−2) + 3·(−0.3)) / 3 = −(−1 + 4 − 0.9) / 3 = −0.7
    assert loss.item() == pytest.approx(-0.7)
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1 / 3, 2 / 3, 0.0], [-1.0, 0.0, 0.0]]))


def test_token_policy_loss_of_an_empty_mask_is_a_connected_zero() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss = token_policy_loss(logprobs, torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0
    assert logprobs.grad is not None and not logprobs.grad.any()


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_one_sgd_step_moves_the_token_probability_with_its_advantage_sign(advantage: float) -> None:
    model = random_model(n_layers=1)
    ids, mask = pad_batch([[3, 5, 7, 2]])
    trained = torch.zeros(1, 4, dtype=torch.bool)
    trained[0, 2] = True
    before = model.token_logprobs(ids, mask)[0, 2].item()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    token_policy_loss(model.token_logprobs(ids, mask), torch.full((1, 4), advantage), trained).backward()
    optimizer.step()

    after = model.token_logprobs(ids, mask)[0, 2].item()
    assert (after - before) * advantage > 0


def test_group_advantages_subtract_the_group_mean_only() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([1.0, 0.0, 0.0]) == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert group_advantages([0.5]) == [0.0]
    assert group_advantages([]) == []


def test_pad_batch_right_pads_and_marks_the_real_tokens() -> None:
    ids, mask = pad_batch([[4, 5, 6], [7], [8, 9]], pad_id=0)
    assert ids.tolist() == [[4, 5, 6], [7, 0, 0], [8, 9, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert ids.dtype == torch.long and mask.dtype == torch.bool


def test_seeded_sampling_is_reproducible() -> None:
    model = random_model()
    prefixes = random_prefixes([3, 6, 2])

    def draw(seed: int) -> tuple[list[list[int]], list[list[float]]]:
        generator = torch.Generator().manual_seed(seed)
        samples = model.sample(prefixes, max_new_tokens=12, stop_id=0, temperature=1.3, generator=generator)
        return samples.tokens, samples.logprobs

    assert draw(7) == draw(7)
    assert draw(7)[0] != draw(8)[0]


def test_temperature_sampling_draws_from_softmax_of_logits_over_temperature() -> None:
    model = random_model(seed=4, n_layers=1)
    prefix = random_prefixes([3])[0]
    temperature, draws = 0.7, 2000
    generator = torch.Generator().manual_seed(0)

    samples = model.sample(
        [prefix] * draws, max_new_tokens=1, stop_id=NEVER, temperature=temperature, generator=generator
    )

    with torch.no_grad():
        expected_logprobs = F.log_softmax(model(torch.tensor([prefix]))[0, -1] / temperature, dim=-1)
    tokens = torch.tensor([tokens[0] for tokens in samples.tokens])
    frequency = torch.bincount(tokens, minlength=VOCAB).double() / draws
    torch.testing.assert_close(frequency, expected_logprobs.exp().double(), atol=0.04, rtol=0)
    assert expected_logprobs.exp().max() > 0.2, "the distribution must be far from uniform to test T"
    drawn_logprobs = torch.tensor([logprobs[0] for logprobs in samples.logprobs])
    torch.testing.assert_close(drawn_logprobs, expected_logprobs[tokens], atol=1e-5, rtol=0)


def test_sampling_refuses_a_continuation_past_max_len() -> None:
    model = random_model(n_layers=1)
    with pytest.raises(ValueError, match="max_len"):
        model.sample([[1] * 60], max_new_tokens=5, stop_id=NEVER, greedy=True)
    with pytest.raises(ValueError, match="greedily"):
        sample_reference(model, [[1]], max_new_tokens=1, stop_id=NEVER, greedy=False)
