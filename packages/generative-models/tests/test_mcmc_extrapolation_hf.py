"""P20 transformers integration: a random-init BertForMaskedLM as the MH proposal, a random-init GPT-2 as q_θ."""

from __future__ import annotations

import numpy as np
import pytest

from icml25.generative_models import mcmc_extrapolation as mx
from icml25.kernels.rng import isolated_rng

transformers = pytest.importorskip("transformers")

VOCAB, LEN = 6, 8


def _bert():
    cfg = transformers.BertConfig(
        vocab_size=VOCAB + 2, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16,
    )  # fmt: skip
    with isolated_rng(0):
        return transformers.AutoModelForMaskedLM.from_config(cfg).eval()


def test_bert_mlm_proposal_runs_mh_with_finite_ratios() -> None:
    toy = mx.SequenceDesignToy(LEN, VOCAB, n_motifs=2, seed=0)
    prop = mx.MaskInfillProposal(_bert(), mask_token_id=VOCAB, mask_frac=0.25, allowed_tokens=range(VOCAB))
    x0 = toy.sample(4, seed=1)
    new, fwd, rev = prop.propose(x0, np.random.default_rng(0))
    assert new.shape == x0.shape and new.max() < VOCAB
    assert np.all(np.isfinite(fwd)) and np.all(np.isfinite(rev)) and not np.allclose(fwd, rev)
    assert np.all(((new != x0).sum(1)) <= prop.n_masked(LEN))
    chains = mx.metropolis_hastings(x0, mx.energy_target(toy.oracle, x0, beta=2.0), prop, 20, seed=0)
    assert len(chains) == 4 and chains[0].states.shape == (21, LEN)
    assert np.mean([c.acceptance_rate for c in chains]) > 0


def test_gpt2_extrapolator_fits_and_transforms() -> None:
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB + 2, n_positions=2 * LEN + 2, n_embd=16, n_layer=1, n_head=2
    )
    with isolated_rng(0):
        lm = transformers.AutoModelForCausalLM.from_config(cfg)
    rng = np.random.default_rng(0)
    src = rng.integers(0, VOCAB, (16, LEN))
    pairs = [(s.tolist(), np.sort(s).tolist()) for s in src]
    model = mx.ExtrapolatorLM(VOCAB, LEN, model=lm).fit(pairs, epochs=3, lr=1e-2)
    assert model.losses[-1] < model.losses[0]
    out = model.transform(src[:3], 2, guide=lambda X: X.sum(1) * 1.0)
    assert out.sequences.shape == (3, LEN) and out.trajectory.shape == (3, 3, LEN)
    with pytest.raises(ValueError, match=r"model vocabulary must hold vocab_size \+ 2 = 10 ids; got 8"):
        mx.ExtrapolatorLM(VOCAB + 2, LEN, model=lm)
