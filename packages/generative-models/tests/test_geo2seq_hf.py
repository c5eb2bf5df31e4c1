"""P27 Geo2Seq with the real transformers library: PreTrainedTokenizerFast export, GPT-2 training, generate()."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import icml25.generative_models as gm
from icml25.kernels.rng import global_rng_state

hf = pytest.importorskip("icml25.generative_models.geo2seq_hf")
transformers = pytest.importorskip("transformers")
Chem = pytest.importorskip("rdkit.Chem")
AllChem = pytest.importorskip("rdkit.Chem.AllChem")


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    out = []
    for i, smiles in enumerate(["CCO", "CC#N", "CC(=O)O", "C1CO1"]):
        mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
        AllChem.EmbedMolecule(mol, randomSeed=i)
        out.append(gm.encode(mol))
    return out


def test_fast_tokenizer_matches_word_level_ids(corpus) -> None:
    tok = gm.Geo2SeqTokenizer().fit(corpus)
    fast = tok.to_transformers()
    assert isinstance(fast, transformers.PreTrainedTokenizerFast)
    assert len(fast) == len(tok)
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id, fast.unk_token_id) == (0, 1, 2, 3)
    for seq in corpus:
        ids = fast(seq)["input_ids"]
        assert ids == tok.encode(seq)
        assert fast.decode(ids, skip_special_tokens=True) == seq
    assert fast("C 9.99")["input_ids"] == [1, tok.vocab_["C"], 3, 2]
    batch = fast(corpus, padding=True, return_tensors="pt")
    ids, mask = tok.batch(corpus)
    assert torch.equal(batch["input_ids"], torch.from_numpy(ids)) and torch.equal(
        batch["attention_mask"], torch.from_numpy(mask)
    )


def test_gpt2_trains_and_generates_parseable_strings(corpus) -> None:
    tok = gm.Geo2SeqTokenizer().fit(corpus)
    ids, mask = tok.batch(corpus * 16, max_length=72)
    before = global_rng_state()
    model = hf.build_gpt2(len(tok), n_layer=1, n_embd=64, n_head=2, seed=0)
    assert isinstance(model, transformers.GPT2LMHeadModel)
    losses = hf.train_lm(model, ids, mask, epochs=12, batch_size=16, lr=3e-3, seed=0)
    assert np.mean(losses[-3:]) < 0.5 * losses[0]
    samples = hf.sample_sequences(model, tok, 8, top_k=5, temperature=0.5, seed=0)
    assert global_rng_state() == before  # seeded: the caller's generators are untouched
    assert samples == hf.sample_sequences(model, tok, 8, top_k=5, temperature=0.5, seed=0)
    parsed = 0
    for s in samples:
        try:
            gm.decode(s)
            parsed += 1
        except gm.Geo2SeqDecodeError:
            pass
    assert parsed >= 4


def test_hf_bad_inputs(corpus) -> None:
    tok = gm.Geo2SeqTokenizer().fit(corpus)
    model = hf.build_gpt2(len(tok), n_layer=1, n_embd=32, n_head=2)
    ids, mask = tok.batch(corpus)
    with pytest.raises(TypeError, match="tokenizer must be a Geo2SeqTokenizer"):
        hf.to_fast_tokenizer({"C": 4})
    with pytest.raises(ValueError, match="not fitted"):
        hf.to_fast_tokenizer(gm.Geo2SeqTokenizer())
    with pytest.raises(ValueError, match="n_embd must be divisible by n_head"):
        hf.build_gpt2(10, n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="mask must have the shape of ids"):
        hf.train_lm(model, ids, mask[:, :-1])
    with pytest.raises(ValueError, match=r"ids must lie in \[0, "):
        hf.train_lm(model, ids + 1000, mask)
    with pytest.raises(ValueError, match="epochs must be a finite number"):
        hf.train_lm(model, ids, mask, epochs=float("nan"))
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        hf.sample_sequences(model, tok, 2, temperature=0.0)
