"""Issue 26, item 3: over a length mixture the SLO percentile is one budget of misses shared
by the whole mixture. A rare long prompt is a rare event in a request's life; the tail must not
be that of a normal whose spread the longest prompts set, which held a replica's rate near zero."""

import math

import pytest

from kvscale.sizing import load
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel
from kvscale.sizing.workload import LengthDistribution, Workload

CAT = default_catalog()


def _config() -> ServingConfig:
    arch = CAT.model("llama-3.1-70b")
    return ServingConfig.build(CAT, arch, CAT.gpu("H100-SXM"), "bf16", 4).with_chunk_budget(8192)


def test_one_arrival_adds_the_mixture_not_a_normal_hand_computed() -> None:
    # 95% of arrivals add 0.1 s, 5% add 2 s: mean 0.195 s, sd 0.414 s. A request whose target
    # leaves 0.5 s meets, at Poisson mean 0.01 arrivals, one long arrival with probability
    # e^-0.01 x 0.01 x 0.05 = 4.95e-4; two or more arrivals add at most P(N >= 2) = 4.97e-5.
    one = ((0.1, 0.95), (2.0, 0.05))
    mean = 0.95 * 0.1 + 0.05 * 2.0
    var = 0.95 * 0.1**2 + 0.05 * 2.0**2 - mean**2
    got = load._arrival_tokens_tail(0.5, 0.01, 1.0, mean, var, 0.0, one)
    single = math.exp(-0.01) * 0.01 * 0.05
    assert single <= got <= single + 1 - math.exp(-0.01) * (1 + 0.01) + 1e-12
    # The normal alone (the old single-arrival term) put Q((0.5 - 0.195) / 0.414) = 23% there.
    assert load._arrival_tokens_tail(0.5, 0.01, 1.0, mean, var, 0.0) > 4 * got
    # The longest point is never cut off by the normal's reach (mean + 9 sd = 3.9 s < 50 s).
    far = load._arrival_tokens_tail(49.0, 0.01, 1.0, 0.1 * 0.999 + 50 * 0.001, 2.5, 0.0, ((0.1, 0.999), (50.0, 0.001)))
    assert far == pytest.approx(math.exp(-0.01) * 0.01 * 0.001, rel=0.05)


def test_a_rare_long_prompt_does_not_stretch_every_requests_tpot() -> None:
    # Short outputs (19-39 gaps) at 0.05 req/s: a request lives ~1 s, so a 60k-token prompt
    # (3% of arrivals) lands in 0.15% of lives, within the 1% the percentile leaves: p99 TPOT
    # is what it is without the long prompts. The old normal term said 70.6 ms of an 80 ms
    # target, so a replica carried a fraction of what it does.
    outputs = LengthDistribution((20, 40), (0.5, 0.5))
    light = ReplicaModel(_config(), Workload.of(LengthDistribution.constant(1000), outputs, 1.0))
    heavy = ReplicaModel(_config(), Workload.of(LengthDistribution((1000, 60000), (0.97, 0.03)), outputs, 1.0))
    tpot_light = light.at_rate(0.05, 64, 99).tpot_p_s
    assert heavy.at_rate(0.05, 64, 99).tpot_p_s <= tpot_light * 1.05
    # Where long arrivals are more than the budget (1 req/s: ~3% of lives), they do show.
    assert heavy.at_rate(1.0, 64, 99).tpot_p_s > light.at_rate(1.0, 64, 99).tpot_p_s * 1.5
