"""Sampling draws from the processed distribution, never a token it excludes, and a seeded row
draws the same tokens whatever shares its batch."""

from __future__ import annotations

import math

import torch

from proxy.engines.base import SamplingParams
from proxy.engines.sampling import inverse_cdf, process_logits, sample


def full_cdf_search(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)


def test_two_level_search_equals_one_cumulative_sum_over_the_vocabulary():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(32, 1000, generator=gen) * 3, dim=-1)  # 1000: not a multiple of the block
    probs[:, 500:700] = 0.0  # a run of excluded tokens spanning blocks
    for u in (torch.rand(32, dtype=torch.float64, generator=gen), torch.zeros(32, dtype=torch.float64)):
        assert torch.equal(inverse_cdf(probs, u, block=64), full_cdf_search(probs, u))


def test_a_token_of_probability_zero_is_never_drawn():
    probs = torch.zeros(3, 300)
    probs[0, 7] = 1.0  # one token
    probs[1, [0, 299]] = 0.5  # first and last
    probs[2, 100:103] = torch.tensor([0.2, 0.3, 0.5])
    for u in (0.0, 0.5, 1 - 1e-16):
        drawn = inverse_cdf(probs, torch.full((3,), u, dtype=torch.float64), block=32)
        assert all(probs[row, int(t)] > 0 for row, t in enumerate(drawn)), (u, drawn)


def test_sampled_frequencies_follow_the_processed_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -3.0]]).expand(40_000, -1)
    params = [SamplingParams(max_new_tokens=1, temperature=0.7, top_k=4)] * 40_000
    torch.manual_seed(0)
    out = sample(logits, params, [None] * 40_000)
    expected = process_logits(logits[:1], params[:1]).exp()[0]
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=6).double()
    assert counts[3] == 0 and counts[5] == 0, "outside the top 4"
    n = counts.sum()
    chi2 = sum(float((counts[i] - n * expected[i]) ** 2 / (n * expected[i])) for i in range(6) if expected[i] > 0)
    assert chi2 < 16.3, chi2  # 3 degrees of freedom: p = 0.001
    # The reported logprob is the chosen token's under that distribution.
    assert all(math.isclose(lp, math.log(expected[t]), rel_tol=1e-5) for t, lp in zip(out.token_ids, out.logprobs))


def test_a_seeded_row_draws_the_same_whatever_its_neighbours():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 500, generator=gen)
    params = [SamplingParams(max_new_tokens=8, temperature=1.0, seed=42)] * 3

    def draw(batch: torch.Tensor, seeded_row: int) -> list[int]:
        g = torch.Generator().manual_seed(42)
        gens: list[torch.Generator | None] = [None] * batch.shape[0]
        gens[seeded_row] = g
        return [sample(batch, params[: batch.shape[0]], gens).token_ids[seeded_row] for _ in range(8)]

    alone = draw(logits[:1], 0)
    torch.manual_seed(123)
    assert draw(logits[[2, 1, 0]][[2, 0, 1]], 0) == alone
    assert draw(torch.cat([logits[1:2], logits[:1]]), 1) == alone


def test_greedy_rows_take_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]])
    params = [SamplingParams(max_new_tokens=1, temperature=0.0), SamplingParams(max_new_tokens=1, temperature=1e-6)]
    assert sample(logits, params, [None, None]).token_ids == [1, 0]
