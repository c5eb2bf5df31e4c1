"""Tests of icml25.llm_efficiency.rapid (RAPID, ICML 2025, P03): the retrieval-augmented target, exact
speculative verification, the decoding loop and its caches, retrieval, the transformers integration, bad
inputs, and the quick reproduction's gate (with broken variants that must fail it)."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml25.kernels.experiment import torch_threads
from icml25.llm_efficiency.experiments import rapid as experiment
from icml25.llm_efficiency.rapid import (
    Chunk,
    InductionLM,
    RapidGenerator,
    augmented_target,
    bm25_scores,
    chunk_text,
    rapid_verify,
    retrieve,
    select_chunks,
    tfidf_scores,
)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread (thread wake-ups dominate otherwise on a busy 2-core machine)."""
    with torch_threads(1):
        yield


def _logits(rows: int, vocab: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson χ² goodness of fit (cells with expected count >= 5), p-value via the regularised gamma."""
    n = float(counts.sum())
    expected = probs.double() * n
    keep = expected >= 5
    stat = float((((counts.double() - expected) ** 2) / expected)[keep].sum())
    dof = int(keep.sum()) - 1
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2))
    )


# ------------------------------------------------------------------------- the retrieval-augmented target
def test_augmented_target_with_eta_zero_returns_p_exactly():
    z, zq = _logits(4, 16, 0), _logits(4, 16, 1)
    assert torch.equal(augmented_target(z, zq, 0.0), z)
    assert torch.equal(torch.softmax(augmented_target(z, zq, 0.0), -1), torch.softmax(z, -1))


def test_augmented_target_closed_form_on_a_small_example():
    z = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    zq = torch.tensor([[3.0, 0.0, 2.9, -5.0]])
    p, q = torch.softmax(z, -1), torch.softmax(zq, -1)
    keep = q >= 0.1 * q.max()  # tokens 0 and 2
    assert keep.tolist() == [[True, False, True, False]]
    expected = z.clone()
    expected[keep] -= 4.0 * (p - q)[keep]
    torch.testing.assert_close(augmented_target(z, zq, 4.0, 0.1), expected, rtol=0, atol=1e-6)


@settings(deadline=None, max_examples=40)
@given(
    seed=st.integers(0, 10_000),
    vocab=st.integers(2, 40),
    eta=st.floats(0.0, 50.0),
    alpha=st.floats(1e-6, 1.0),
)
def test_augmented_target_bound_mask_and_normalisation(seed: int, vocab: int, eta: float, alpha: float):
    z, zq = _logits(3, vocab, seed, 3.0), _logits(3, vocab, seed + 1, 3.0)
    z_hat = augmented_target(z, zq, eta, alpha)
    q = torch.softmax(zq, -1)
    outside = q < alpha * q.amax(-1, keepdim=True)
    assert float((z_hat - z).abs().max()) <= eta + 1e-5  # |ẑ − z|∞ ≤ η since |p − q| ≤ 1
    assert torch.equal(z_hat[outside], z[outside])  # the truncated tokens keep their logits exactly
    torch.testing.assert_close(torch.softmax(z_hat, -1).sum(-1), torch.ones(3), rtol=0, atol=1e-5)
    # p = q (up to a constant shift of the drafter's logits) leaves the target unchanged
    torch.testing.assert_close(augmented_target(z, z + 7.0, eta, alpha), z, rtol=0, atol=1e-5 * (1 + eta))


def test_alpha_one_changes_only_the_drafter_argmax():
    z, zq = _logits(5, 12, 3), _logits(5, 12, 4)
    z_hat = augmented_target(z, zq, 10.0, alpha=1.0)
    changed = z_hat != z
    top = zq.argmax(-1)
    assert changed.sum(-1).tolist() == [1] * 5
    assert changed[torch.arange(5), top].all()


def test_minus_inf_logits_stay_minus_inf():
    z = torch.tensor([[0.0, -math.inf, 1.0]])
    zq = torch.tensor([[0.5, 0.1, -math.inf]])
    z_hat = augmented_target(z, zq, 5.0, 0.1)
    assert z_hat[0, 1] == -math.inf and torch.isfinite(z_hat[0, [0, 2]]).all()


# ------------------------------------------------------------------------- speculative verification
def _first_token_law(z: torch.Tensor, zq: torch.Tensor, eta: float, residual: str) -> torch.Tensor:
    """Exact law of the first emitted token, by enumerating the draft token y ~ q and the acceptance."""
    p, q = torch.softmax(z[0].double(), -1), torch.softmax(zq[0].double(), -1)
    p_hat = torch.softmax(augmented_target(z[:1], zq, eta).double(), -1)[0]
    accept = torch.minimum(torch.ones_like(q), p_hat / q)
    law = q * accept  # y accepted (then y is the first token)
    reject = float((q * (1 - accept)).sum())
    res = (p_hat - q).clamp_min(0) if residual == "exact" else torch.maximum(p - q, p - p_hat).clamp_min(0)
    return law + reject * res / res.sum()


@pytest.mark.parametrize("eta", [0.0, 3.0])
def test_exact_residual_emits_p_hat_by_enumeration(eta: float):
    z, zq = _logits(2, 8, 10), _logits(1, 8, 11)
    p_hat = torch.softmax(augmented_target(z[:1], zq, eta).double(), -1)[0]
    torch.testing.assert_close(_first_token_law(z, zq, eta, "exact"), p_hat, rtol=0, atol=1e-9)
    if eta == 0.0:  # standard speculative sampling: exactly the target
        torch.testing.assert_close(p_hat, torch.softmax(z[0].double(), -1), rtol=0, atol=1e-12)
    else:  # the official residual max(p − q, p − p̂) is not p̂-distributed (documented)
        assert float((_first_token_law(z, zq, eta, "official") - p_hat).abs().max()) > 0.01


@pytest.mark.parametrize(("eta", "residual"), [(0.0, "exact"), (3.0, "exact"), (3.0, "official")])
def test_rapid_verify_samples_its_exact_law(eta: float, residual: str):
    z, zq = _logits(2, 8, 10), _logits(1, 8, 11)
    g = torch.Generator().manual_seed(5)
    n = 12_000
    drafts = torch.multinomial(torch.softmax(zq[0], -1), n, replacement=True, generator=g)
    counts = torch.zeros(8)
    for i in range(n):
        tokens, _ = rapid_verify(drafts[i : i + 1], zq, z, eta=eta, residual=residual, generator=g)
        counts[tokens[0]] += 1
    assert _chi2_pvalue(counts, _first_token_law(z, zq, eta, residual)) > 1e-3


def test_rapid_verify_accepts_a_prefix_and_returns_n_plus_one_tokens():
    z = _logits(6, 10, 20)
    draft = torch.tensor([1, 2, 3, 4, 5])
    # q concentrated on the drafts, p agrees on the first two and vetoes the third
    zq = torch.full((5, 10), -20.0)
    zq[torch.arange(5), draft] = 0.0
    z[:2, :] = -20.0
    z[0, 1] = z[1, 2] = 0.0
    z[2, :] = 0.0
    z[2, 3] = -30.0
    tokens, n = rapid_verify(draft, zq, z, eta=0.0, generator=torch.Generator().manual_seed(0))
    assert n == 2 and tokens[:2].tolist() == [1, 2] and len(tokens) == 3 and tokens[2] != 3
    tokens, n = rapid_verify(draft, zq, z, eta=0.0, greedy=True)
    assert n == 2 and tokens[:2].tolist() == [1, 2] and tokens[2] == int(z[2].argmax())


def test_rapid_verify_all_accepted_adds_a_bonus_token_from_the_unmodified_target():
    draft = torch.tensor([3, 1])
    zq = torch.full((2, 5), -30.0)
    zq[0, 3] = zq[1, 1] = 0.0
    z = zq.new_full((3, 5), -30.0)
    z[0, 3] = z[1, 1] = 0.0
    z[2, 4] = 0.0
    tokens, n = rapid_verify(draft, zq, z, eta=50.0, greedy=True)
    assert n == 2 and tokens.tolist() == [3, 1, 4]
    assert rapid_verify(torch.zeros(0, dtype=torch.int64), zq[:0], z[2:], eta=1.0, greedy=True)[
        0
    ].tolist() == [4]


# ------------------------------------------------------------------------- the decoding loop
class _Recorder(torch.nn.Module):
    """Wraps a model and records (cache length before the call, number of input ids) per forward."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, []
        self.vocab_size = getattr(model, "vocab_size", None) or model.config.vocab_size

    def new_cache(self):
        if hasattr(self.model, "new_cache"):
            return self.model.new_cache()
        from icml25.llm_efficiency.rapid.hf import new_dynamic_cache

        return new_dynamic_cache(self.model)

    def forward(self, input_ids, cache=None, **kwargs):
        self.calls.append((cache.get_seq_length(), int(input_ids.shape[1])))
        return self.model(input_ids, cache=cache, **kwargs)


def _exact_output_law(target, drafter, long, rag, n_new, gamma, eta, alpha=0.1, confidence=None):
    """Exact law of RAPID's output sequence (residual 'exact'), enumerating drafts and acceptances; a draft
    with drafter probability below ``confidence`` ends its round (the official stop rule)."""
    vocab = target.vocab_size

    def dist(model, ctx):
        return model(torch.tensor([ctx]), logits_to_keep=1).logits[0, -1]

    law: dict[tuple[int, ...], float] = {}

    def emit(gen, prob):
        if len(gen) == n_new:
            law[gen] = law.get(gen, 0.0) + prob
            return
        draft(gen, (), prob, min(gamma, n_new - len(gen) - 1))

    def draft(gen, ys, prob, k):
        zp = dist(target, long + list(gen + ys))
        if len(ys) == k:  # all accepted: bonus token from p
            for v, pv in enumerate(torch.softmax(zp.double(), -1).tolist()):
                emit(gen + ys + (v,), prob * pv)
            return
        zq = dist(drafter, rag + list(gen + ys))
        q = torch.softmax(zq.double(), -1)
        p_hat = torch.softmax(augmented_target(zp[None], zq[None], eta, alpha).double(), -1)[0]
        accept = torch.minimum(torch.ones_like(q), p_hat / q)
        for y in range(vocab):
            stop = confidence is not None and float(q[y]) < confidence
            draft(gen, (*ys, y), prob * float(q[y] * accept[y]), len(ys) + 1 if stop else k)
        res = (p_hat - q).clamp_min(0)
        if float(res.sum()) > 0:
            reject = float((q * (1 - accept)).sum())
            for v, rv in enumerate((res / res.sum()).tolist()):
                emit(gen + ys + (v,), prob * reject * rv)

    emit((), 1.0)
    return law


def _tiny_models():
    target = InductionLM(3, tau=2.0, smoothing=0.3)
    drafter = InductionLM(3, tau=0.7, smoothing=0.1)
    return target, drafter, [0, 1, 2, 0, 2, 1, 0], [2, 1, 1, 0]


def test_eta_zero_output_law_equals_target_only_decoding_exactly():
    target, drafter, long, rag = _tiny_models()
    law = _exact_output_law(target, drafter, long, rag, n_new=3, gamma=2, eta=0.0)
    for seq in itertools.product(range(3), repeat=3):
        ctx, prob = list(long), 1.0
        for t in seq:
            prob *= float(torch.softmax(target(torch.tensor([ctx])).logits[0, -1].double(), -1)[t])
            ctx.append(t)
        assert law[seq] == pytest.approx(prob, abs=1e-9)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("confidence", [None, 0.4])
def test_generator_samples_the_exact_output_law(confidence):
    target, drafter, long, rag = _tiny_models()
    law = _exact_output_law(target, drafter, long, rag, n_new=3, gamma=2, eta=2.0, confidence=confidence)
    if confidence is not None:  # the stop rule changes where the bonus token (drawn from p, not p̂) falls
        fixed = _exact_output_law(target, drafter, long, rag, n_new=3, gamma=2, eta=2.0)
        assert max(abs(law.get(c, 0.0) - fixed.get(c, 0.0)) for c in {*law, *fixed}) > 1e-3
    cells = list(itertools.product(range(3), repeat=3))
    rapid = RapidGenerator(target, drafter, gamma=2, eta=2.0, confidence_threshold=confidence)
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(len(cells))
    for _ in range(3000):
        out = rapid.generate(torch.tensor(long), torch.tensor(rag), 3, generator=g, eos_token_id=[])
        counts[cells.index(tuple(out.tokens.tolist()))] += 1
    assert _chi2_pvalue(counts, torch.tensor([law.get(c, 0.0) for c in cells])) > 1e-3


def _greedy(model, prompt, n):
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(int(model(torch.tensor([ctx])).logits[0, -1].argmax()))
    return ctx[len(prompt) :]


def test_greedy_with_eta_zero_reproduces_target_greedy_output():
    rng = np.random.default_rng(0)
    target, drafter = InductionLM(20, tau=4.0, smoothing=0.05), InductionLM(20, tau=1.0, smoothing=0.05)
    long, rag = rng.integers(0, 20, 60).tolist(), rng.integers(0, 20, 12).tolist()
    out = RapidGenerator(target, drafter, gamma=4, eta=0.0).generate(
        torch.tensor(long), torch.tensor(rag), 15, do_sample=False, eos_token_id=[]
    )
    assert out.tokens.tolist() == _greedy(target, long, 15)
    assert out.acceptance_rate < 1.0 and out.target_calls < 15


def test_caches_are_cropped_to_the_accepted_prefix():
    rng = np.random.default_rng(1)
    target = _Recorder(InductionLM(12, tau=3.0, smoothing=0.2))
    drafter = _Recorder(InductionLM(12, tau=1.0, smoothing=0.2))
    long, rag = rng.integers(0, 12, 40).tolist(), rng.integers(0, 12, 10).tolist()
    out = RapidGenerator(target, drafter, gamma=3, eta=1.0).generate(
        torch.tensor(long), torch.tensor(rag), 12, seed=0, eos_token_id=[]
    )
    rounds = len(out.accepted_per_round)
    assert any(n < d for n, d in zip(out.accepted_per_round, out.drafted_per_round))  # rejections happened
    assert max(out.accepted_per_round) <= 3 and sum(a + 1 for a in out.accepted_per_round) >= 12
    verify_calls = target.calls[1:]  # after the prefill
    assert len(verify_calls) == rounds == out.target_calls
    emitted = 0
    drafter_calls = iter(drafter.calls[1:])
    for r, (n, d) in enumerate(zip(out.accepted_per_round, out.drafted_per_round)):
        # the target's cache holds its whole sequence but the last token, then gets it + the d drafts
        assert verify_calls[r] == (len(long) - 1 + emitted, 1 + d)
        if d:
            first = next(drafter_calls)
            full_before = r > 0 and out.accepted_per_round[r - 1] == out.drafted_per_round[r - 1] > 0
            # after a rejection the drafter's cache is the accepted prefix (sequence minus the last token);
            # after a fully accepted round its last draft was never fed, so it gets two tokens
            assert first == (len(rag) - 1 + emitted - int(full_before), 1 + int(full_before))
            for _ in range(d - 1):
                next(drafter_calls)
        emitted += n + 1
    assert out.drafter_calls == len(drafter.calls) - 1


def test_eos_inside_the_draft_stops_generation_and_accepts_at_most_gamma():
    model = InductionLM(8, tau=5.0, smoothing=0.01)
    prompt = torch.tensor([1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1])
    out = RapidGenerator(model, gamma=4, eta=0.0).generate(
        prompt, prompt[-7:], 20, do_sample=False, eos_token_id=5
    )
    assert out.tokens.tolist() == [2, 3, 4, 5] and out.stopped_at_eos
    free = RapidGenerator(model, gamma=4, eta=0.0).generate(
        prompt, prompt[-7:], 20, do_sample=False, eos_token_id=[]
    )
    assert len(free.tokens) == 20 and max(free.accepted_per_round) <= 4 and not free.stopped_at_eos


def test_confidence_stop_ends_a_round_after_an_unconfident_draft():
    rng = np.random.default_rng(4)
    target, drafter = InductionLM(20, tau=4.0, smoothing=0.05), InductionLM(20, tau=1.0, smoothing=0.05)
    long, rag = torch.tensor(rng.integers(0, 20, 60)), torch.tensor(rng.integers(0, 20, 12))

    def rounds(threshold):
        rapid = RapidGenerator(target, drafter, gamma=4, eta=1.0, confidence_threshold=threshold)
        return rapid.generate(long, rag, 16, do_sample=False, eos_token_id=[])

    fixed, always, never = rounds(None), rounds(1.0), rounds(0.0)
    assert fixed.drafted_per_round[:-1] == [4] * (len(fixed.drafted_per_round) - 1)
    assert torch.equal(never.tokens, fixed.tokens) and never.drafted_per_round == fixed.drafted_per_round
    assert set(always.drafted_per_round) <= {0, 1}  # every draft has probability < 1: one per round
    # the rule: a round stops exactly after its first draft whose drafter probability is below 0.5
    half = rounds(0.5)
    seq = rag.tolist()
    for n, d in zip(half.accepted_per_round, half.drafted_per_round):
        probs = []
        ctx = list(seq)
        for _ in range(d):
            q = torch.softmax(drafter(torch.tensor([ctx])).logits[0, -1], -1)
            y = int(q.argmax())
            probs.append(float(q[y]))
            ctx.append(y)
        assert all(p >= 0.5 for p in probs[:-1])
        budget = min(4, 16 - (len(seq) - len(rag)) - 1)  # γ, or fewer at the end of generation
        assert d == budget or probs[-1] < 0.5
        seq = seq + half.tokens[len(seq) - len(rag) : len(seq) - len(rag) + n + 1].tolist()
    assert any(d < 4 for d in half.drafted_per_round[:-1])


def test_self_speculation_and_determinism_with_a_seed():
    rng = np.random.default_rng(2)
    model = InductionLM(30, tau=5.0, smoothing=0.1)
    long, rag = torch.tensor(rng.integers(0, 30, 50)), torch.tensor(rng.integers(0, 30, 8))
    a = RapidGenerator(model, gamma=3, eta=5.0).generate(long, rag, 10, seed=11, eos_token_id=[])
    b = RapidGenerator(model, gamma=3, eta=5.0).generate(long, rag, 10, seed=11, eos_token_id=[])
    assert torch.equal(a.tokens, b.tokens) and len(a.tokens) == 10
    assert a.target_calls_per_token == a.target_calls / 10 < 1.0


# ------------------------------------------------------------------------- retrieval
def test_select_chunks_keeps_original_order_threshold_and_caps_k():
    scores = np.array([0.1, 0.9, 0.2, 0.8, 0.5])
    assert select_chunks(scores, k=3) == [1, 3, 4]  # top 3 by score, returned in context order
    assert select_chunks(scores, k=3, threshold=0.6) == [1, 3]
    assert select_chunks(scores, k=2, threshold=0.95) == [1]  # nothing passes: fall back to the best
    assert select_chunks(scores, k=50) == [0, 1, 2, 3, 4]


def test_tfidf_and_bm25_rank_the_rare_shared_term_first():
    docs = [["a", "b", "c"], ["a", "x", "key"], ["a", "key", "topic"], ["z", "z"]]
    query = ["topic", "key"]
    tf = tfidf_scores(docs, query)
    assert tf.argmax() == 2 and tf[0] == 0 and tf[3] == 0 and 0 < tf[1] < tf[2] <= 1
    bm = bm25_scores(docs, query)
    assert bm.argmax() == 2 and bm[0] == 0 and bm[1] > 0
    # closed form of the query-document cosine (smoothed idf, raw counts)
    idf = {t: math.log(5 / (1 + df)) + 1 for t, df in {"a": 3, "key": 2, "topic": 1}.items()}
    d = np.array([idf["a"], idf["key"], idf["topic"]])
    qv = np.array([0, idf["key"], idf["topic"]])
    assert tf[2] == pytest.approx(d @ qv / np.linalg.norm(d) / np.linalg.norm(qv))


def test_tfidf_matches_scikit_learn():
    sklearn_text = pytest.importorskip("sklearn.feature_extraction.text")
    docs = ["the cat sat on the mat", "a dog and a cat", "stock markets fell", "the dog barked at the mat"]
    query = "cat on a mat"
    vec = sklearn_text.TfidfVectorizer(token_pattern=r"\w+").fit(docs)
    expected = (vec.transform(docs) @ vec.transform([query]).T).toarray()[:, 0]
    ours = tfidf_scores([d.split() for d in docs], query.split())
    np.testing.assert_allclose(ours, expected, atol=1e-12)


def test_retrieve_joins_selected_chunks_in_context_order():
    chunks = [
        Chunk("alpha beta", 0),
        Chunk("gamma key delta", 12),
        Chunk("epsilon", 30),
        Chunk("key topic", 40),
    ]
    assert retrieve(chunks, "key topic", k=2) == "gamma key delta\n\nkey topic"
    assert retrieve(chunks, "key topic", k=2, scorer="tfidf", threshold=0.9) == "key topic"
    # a dense embedder (e.g. sentence-transformers' encode): cosine similarity of the embeddings
    table = {
        "alpha beta": [1, 0],
        "gamma key delta": [0, 1],
        "epsilon": [1, 1],
        "key topic": [0.1, 1],
        "q": [0, 1],
    }
    out = retrieve(
        [c.text for c in chunks], "q", k=1, scorer=lambda texts: np.array([table[t] for t in texts])
    )
    assert out == "gamma key delta"


def test_chunk_text_respects_budget_positions_and_separator_priority():
    text = "First para one two three.\n\nSecond para, with a clause. And more words here.\nA line.  "
    chunks = chunk_text(text, max_tokens=6)
    assert all(len(c.text.split()) <= 6 for c in chunks)
    assert all(text[c.start :].startswith(c.text) for c in chunks)
    assert [c.start for c in chunks] == sorted(c.start for c in chunks)
    assert " ".join(c.text for c in chunks).split() == text.split()  # no overlap, nothing lost
    assert chunks[0].text == "First para one two three."  # the paragraph break is the first separator
    assert chunk_text(text, max_tokens=100) == [Chunk(text.strip(), 0)]
    long_word = chunk_text("x" * 10, tokenizer=lambda s: list(s), max_tokens=4)
    assert [c.text for c in long_word] == ["xxxx", "xxxx", "xx"]


# ------------------------------------------------------------------------- InductionLM
def test_induction_lm_incremental_equals_full_and_closed_form():
    model = InductionLM(6, tau=2.0, smoothing=0.1)
    ids = torch.tensor([[0, 1, 2, 0, 3, 0]])
    full = model(ids).logits
    cache = model.new_cache()
    parts = [model(ids[:, :4], cache=cache).logits, model(ids[:, 4:], cache=cache).logits]
    torch.testing.assert_close(torch.cat(parts, 1), full)
    # last token 0 occurred at j=0 (successor 1, weight e^{-5/2}) and j=3 (successor 3, weight e^{-2/2})
    w1, w3 = math.exp(-2.5), math.exp(-1.0)
    expected = torch.full((6,), 0.1 / 6)
    expected[1] += 0.9 * w1 / (w1 + w3)
    expected[3] += 0.9 * w3 / (w1 + w3)
    torch.testing.assert_close(full[0, -1].exp(), expected)
    torch.testing.assert_close(full[0, 2].exp(), torch.full((6,), 1 / 6))  # token 2 never seen before


# ------------------------------------------------------------------------- bad inputs (one test each)
def test_bad_eta_alpha_gamma_residual():
    model = InductionLM(10)
    z = _logits(2, 10, 0)
    with pytest.raises(ValueError, match=r"eta must be a finite float in \[0\.0, inf\)"):
        RapidGenerator(model, eta=-1.0)
    with pytest.raises(ValueError, match="eta"):
        augmented_target(z, z, -0.5)
    for alpha in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"alpha must be a finite float in \(0.0, 1.0\]"):
            RapidGenerator(model, alpha=alpha)
    with pytest.raises(ValueError, match="gamma must be an int >= 1"):
        RapidGenerator(model, gamma=0)
    with pytest.raises(ValueError, match="residual must be one of"):
        RapidGenerator(model, residual="textbook")
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"confidence_threshold must be a finite float in \[0.0, 1.0\]"):
            RapidGenerator(model, confidence_threshold=bad)
    with pytest.raises(TypeError, match="confidence_threshold"):
        RapidGenerator(model, confidence_threshold=True)


def test_bad_vocabulary_mismatch_between_target_and_drafter():
    with pytest.raises(ValueError, match="drafter: vocabulary size 12 differs from the target's 10"):
        RapidGenerator(InductionLM(10), InductionLM(12))

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

        def __len__(self):
            return len(self.vocab)

    with pytest.raises(ValueError, match="drafter_tokenizer: its vocabulary differs"):
        RapidGenerator(
            InductionLM(10), InductionLM(10), tokenizer=Tok({"a": 0}), drafter_tokenizer=Tok({"b": 0})
        )


def test_bad_batch_size_and_empty_prompts():
    rapid = RapidGenerator(InductionLM(10), gamma=2)
    with pytest.raises(ValueError, match="long_ids must hold one sequence"):
        rapid.generate(
            torch.zeros(2, 5, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 3, eos_token_id=[]
        )
    with pytest.raises(ValueError, match="rag_ids must hold at least one token"):
        rapid.generate(
            torch.zeros(5, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 3, eos_token_id=[]
        )
    with pytest.raises(ValueError, match="long_ids must hold ids in"):
        rapid.generate(torch.tensor([1, 99]), torch.tensor([1]), 3, eos_token_id=[])


def test_rag_prompt_longer_than_the_long_prompt_warns():
    rapid = RapidGenerator(InductionLM(10), gamma=2)
    with pytest.warns(UserWarning, match="no speed benefit"):
        out = rapid.generate(torch.tensor([1, 2]), torch.tensor([1, 2, 3, 4]), 3, seed=0, eos_token_id=[])
    assert len(out.tokens) == 3


def test_bad_logits_nan_or_minus_inf_everywhere():
    draft = torch.tensor([1])
    zq, z = _logits(1, 5, 0), _logits(2, 5, 1)
    z[1, 2] = float("nan")
    with pytest.raises(ValueError, match="p_logits must not contain NaN"):
        rapid_verify(draft, zq, z, eta=1.0)
    zq = torch.full((1, 5), -math.inf)
    with pytest.raises(ValueError, match="q_logits must have a finite entry in every row"):
        rapid_verify(draft, zq, _logits(2, 5, 1), eta=1.0)


def test_missing_eos_id_is_an_error_naming_it():
    rapid = RapidGenerator(InductionLM(10), gamma=2)  # InductionLM defines no EOS token
    with pytest.raises(ValueError, match="eos_token_id: the target model defines no EOS token"):
        rapid.generate(torch.tensor([1, 2, 3]), torch.tensor([3]), 4)
    with pytest.raises(ValueError, match="eos_token_id must hold non-negative ints"):
        rapid.generate(torch.tensor([1, 2, 3]), torch.tensor([3]), 4, eos_token_id=[-1])


def test_bad_retrieval_inputs():
    with pytest.raises(ValueError, match="documents must hold at least one document"):
        tfidf_scores([], ["a"])
    with pytest.raises(TypeError, match="query must be a sequence of terms"):
        bm25_scores([["a"]], "a")
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        select_chunks([0.5, 0.2], k=0)
    with pytest.raises(ValueError, match="scorer must be 'bm25', 'tfidf'"):
        retrieve(["a"], "a", k=1, scorer="dense")
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1"):
        chunk_text("a b", max_tokens=0)


# ------------------------------------------------------------------------- transformers integration
def _tiny_llama(seed: int, vocab: int = 128):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    from icml25.kernels.rng import isolated_rng

    with isolated_rng(seed):
        return transformers.LlamaForCausalLM(config).eval()


def test_hf_greedy_eta_zero_reproduces_target_greedy_token_for_token():
    from icml25.llm_efficiency.rapid import rapid_generate

    target = _tiny_llama(0)  # self-speculation: the drafter is the target's weights on the RAG prompt
    g = torch.Generator().manual_seed(0)
    long_ids = torch.randint(3, 128, (1, 256), generator=g)
    rag_ids = torch.cat([long_ids[:, 100:132], long_ids[:, -32:]], dim=1)  # 64 tokens: "retrieved" + query
    reference = target.generate(long_ids, max_new_tokens=24, do_sample=False)
    out = RapidGenerator(target, gamma=5, eta=0.0).generate(long_ids, rag_ids, 24, do_sample=False)
    assert out.tokens.tolist() == reference[0, 256:].tolist()
    assert sum(out.accepted_per_round) > 0  # drafts were accepted, and the output is still the target's
    via_generate = target.generate(
        long_ids, custom_generate=rapid_generate, rag_input_ids=rag_ids, gamma=5, eta=0.0, max_new_tokens=24,
        do_sample=False,
    )  # fmt: skip
    assert torch.equal(via_generate, reference)


def test_hf_dynamic_cache_is_cropped_by_removing_tokens():
    target, drafter = _Recorder(_tiny_llama(0)), _Recorder(_tiny_llama(1))
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(1))
    out = RapidGenerator(target, drafter, gamma=4, eta=2.0).generate(
        ids, ids[:, -12:], 16, seed=0, eos_token_id=[]
    )
    emitted = 0
    for r, (n, d) in enumerate(zip(out.accepted_per_round, out.drafted_per_round)):
        assert target.calls[1 + r] == (39 + emitted, 1 + d)  # the DynamicCache holds the accepted prefix
        emitted += n + 1
    assert len(out.tokens) == 16


def test_hf_generate_sampling_with_self_speculation_and_eos():
    from icml25.llm_efficiency.rapid import rapid_generate

    target = _tiny_llama(2)
    ids = torch.randint(3, 128, (1, 48), generator=torch.Generator().manual_seed(2))
    kw = {
        "custom_generate": rapid_generate,
        "rag_input_ids": ids[:, -16:],
        "gamma": 4,
        "eta": 5.0,
        "do_sample": True,
    }
    a = target.generate(ids, max_new_tokens=12, seed=7, temperature=0.8, top_k=20, eos_token_id=None, **kw)
    b = target.generate(ids, max_new_tokens=12, seed=7, temperature=0.8, top_k=20, eos_token_id=None, **kw)
    assert a.shape == (1, 60) and torch.equal(a, b) and torch.equal(a[:, :48], ids)
    # EOS: greedy (deterministic) with the third greedy token as EOS stops exactly where transformers stops
    greedy = {**kw, "do_sample": False, "max_new_tokens": 12}
    eos = int(target.generate(ids, **greedy, eos_token_id=None)[0, 50])
    c = target.generate(ids, **greedy, eos_token_id=eos)
    assert int(c[0, -1]) == eos and c.shape[1] <= 51
    assert torch.equal(c, target.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=eos))
    with pytest.raises(ValueError, match="rag_input_ids is required"):
        target.generate(ids, max_new_tokens=4, custom_generate=rapid_generate)
    with pytest.raises(ValueError, match="drafter: vocabulary size 100 differs"):
        target.generate(ids, max_new_tokens=4, drafter=_tiny_llama(3, vocab=100), **kw)


# ------------------------------------------------------------------------- the reproduction's quick gate
def test_quick_reproduction_passes():
    report = experiment.run(quick=True, seed=0)
    m = report.metrics
    assert report.paper == "P03" and report.passed, report.failed_checks
    assert len(report.checks) == 7
    # the central ordering: RAPID far above the distracted long-context target, near the RAG drafter
    assert m["em_target"] <= 40 and m["em_drafter"] >= 70
    assert m["em_rapid"] >= m["em_target"] + 20 and m["em_rapid"] >= 0.8 * m["em_drafter"]
    assert m["calls_per_token_rapid"] <= 0.5
    # the veto: the alpha mask keeps the target's first token against a misled drafter
    assert m["first_rapid_corrupt"] >= m["first_target"] - 5 >= m["first_no_alpha_corrupt"] + 15
    assert m["acceptance_rapid_eta0_corrupt"] < 1.0


def _broken_verify(sign: float = 1.0, accept_with_p: bool = False):
    """rapid_verify with a deliberate bug: ẑ = z + η·g (sign = −1), or acceptance tested against p."""

    def verify(draft, q_logits, p_logits, *, eta, alpha, residual, greedy, generator):
        k = len(draft)
        p, q = torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)
        g = torch.where(q >= alpha * q.amax(-1, keepdim=True), p[:k] - q, torch.zeros_like(q))
        p_hat = torch.softmax(p_logits[:k] - sign * eta * g, -1)
        test = p[:k] if accept_with_p else p_hat
        idx = torch.arange(k)
        accepted = torch.rand(k, generator=generator) * q[idx, draft] < test[idx, draft]
        n = int(torch.cumprod(accepted.long(), 0).sum()) if k else 0
        law = p[k] if n == k else (p_hat[n] - q[n]).clamp_min(0)
        law = law if float(law.sum()) > 0 else p_hat[n]
        return torch.cat([draft[:n], torch.multinomial(law, 1, generator=generator)]), n

    return verify


@pytest.mark.parametrize(
    "broken",
    [_broken_verify(sign=-1.0), _broken_verify(accept_with_p=True)],
    ids=["sign_error", "accept_with_p"],
)
def test_quick_gate_fails_for_broken_variants(broken):
    report = experiment.run(quick=True, seed=0, verify=broken)
    assert not report.passed
    assert "(b) eta=10: EM >= target EM + 20 points" in report.failed_checks
    assert report.metrics["em_rapid"] < report.metrics["em_target"] + 20


def test_threshold_text_is_the_same_in_both_modes():
    assert experiment.threshold(True) == experiment.threshold(False)
    assert experiment.threshold(True).count(";") == 6


def test_run_writes_the_figure(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import dataclasses

    monkeypatch.setattr(
        experiment, "QUICK", dataclasses.replace(experiment.QUICK, items=4, eta_sweep=(0.0, 5.0))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = experiment.run(quick=True, seed=0, out_dir=tmp_path)
    assert [f.name for f in report.figures] == ["p03_rapid.png"] and report.figures[0].stat().st_size > 0
    assert {"em_rapid_eta5", "first_rapid_eta5_corrupt", "em_rapid_eta0"} <= set(report.metrics)
