"""P29 transformers integration: random-init Llama models as GraphGPT backbones (NTP causal, SMTP bidirectional)."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from icml25.generative_models import graphgpt as gg
from icml25.kernels.experiment import torch_threads

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("icml25.generative_models.graphgpt_hf")


def test_build_graphgpt_returns_llama_models_and_bidirectional_mask_works() -> None:
    tok = gg.GraphTokenizer(gg.SerializeConfig(node_scope=16))
    ids, am = tok.batch([nx.cycle_graph(5), nx.path_graph(3)], seed=0)
    with torch_threads(1), torch.no_grad():
        lm = hf.build_graphgpt(len(tok), "tiny", causal=True)
        assert isinstance(lm, transformers.LlamaForCausalLM)
        assert lm(input_ids=ids, attention_mask=am.long()).logits.shape == (2, ids.shape[1], len(tok))
        enc = hf.build_graphgpt(len(tok), None, causal=False, hidden=32, layers=1, heads=2).eval()
        assert isinstance(enc, transformers.LlamaModel)
        later = ids.clone()
        later[0, 5] = tok.mask_id
        h1 = enc(input_ids=ids, attention_mask=hf.bidirectional_mask(am)).last_hidden_state
        h2 = enc(input_ids=later, attention_mask=hf.bidirectional_mask(am)).last_hidden_state
        assert not torch.allclose(h1[0, :5], h2[0, :5])  # earlier states see a later token: bidirectional
        c1 = enc(input_ids=ids, attention_mask=am.long()).last_hidden_state
        c2 = enc(input_ids=later, attention_mask=am.long()).last_hidden_state
        torch.testing.assert_close(c1[0, :5], c2[0, :5])  # the default mask is causal
    with pytest.raises(ValueError, match="size must be one of"):
        hf.build_graphgpt(10, "huge")


def test_hf_backend_pretrains_with_smtp_and_ntp() -> None:
    tok = gg.GraphTokenizer(gg.SerializeConfig(node_scope=12))
    gs = [nx.cycle_graph(k) for k in range(3, 9)] * 3
    with torch_threads(1):
        for causal, objective in ((False, "smtp"), (True, "ntp")):
            m = gg.GraphGPTModel(len(tok), 32, 1, 2, causal=causal, backend="hf", seed=0)
            assert isinstance(m.hf, transformers.LlamaModel)
            losses = gg.pretrain(m, tok, gs, 30, objective=objective, batch_size=8, lr=3e-3, seed=0, views=2)
            assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.2
        clf = gg.GraphGPTClassifier(
            gg.SerializeConfig(node_scope=12), hidden=16, layers=1, heads=2, backend="hf", epochs=2
        )
        assert clf.fit(gs[:6], [0, 1, 0, 1, 0, 1]).predict_proba(gs[:2]).shape == (2, 2)
