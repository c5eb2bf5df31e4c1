"""Tests of icml25.llm_efficiency.lara (LaRA, ICML 2025, P38): the data loader, chunking, hybrid retrieval,
prompts, judges, the two solvers (a transformers LM included), the router as a scikit-learn estimator, the
synthetic mini-LaRA, bad inputs, and the quick reproduction's gate (with a broken variant that must fail it)."""

from __future__ import annotations

import itertools
import json
import logging
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.model_selection import GridSearchCV

from icml25.kernels.experiment import torch_threads
from icml25.llm_efficiency.experiments import lara as experiment
from icml25.llm_efficiency.lara import (
    FEATURE_NAMES,
    LC_READERS,
    Chunker,
    DocIndex,
    HybridRetriever,
    LaraItem,
    LexicalJudge,
    LlamaIndexRetriever,
    LLMJudge,
    RagLcRouter,
    RagReader,
    SimulatedLCReader,
    build_prompt,
    evaluate_arm,
    extract_answer,
    fit_context,
    guideline_route,
    is_refusal,
    load_lara,
    make_mini_lara,
    normalize_numbers,
    question_cues,
    routed_accuracy,
    router_features,
    save_lara,
    score_predictions,
)
from icml25.llm_efficiency.rapid import bm25_scores

DOC = "Alpha beta gamma. The revenue of Acme was 120 dollars. Delta epsilon zeta eta theta. Acme hired staff."


def _record(task="location", **kw):
    rec = {
        "type": "financial",
        "level": task,
        "length": "32k",
        "file": "acme.txt",
        "question": "What was the revenue of Acme?",
        "answer": "$2,576,340.",
        "context_order": [3],
    }
    rec.update(kw)
    return rec


def _write(root, records, docs=("acme.txt",), name="32k_financial_location.jsonl"):
    (root / "query").mkdir(parents=True, exist_ok=True)
    (root / "query" / name).write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    for d in docs:
        (root / "32k" / "financial").mkdir(parents=True, exist_ok=True)
        (root / "32k" / "financial" / d).write_text(DOC)


# ------------------------------------------------------------------------------------------------ data
def test_loader_parses_every_official_field_and_maps_level_to_task(tmp_path):
    _write(tmp_path, [_record(), _record(question="Q2?", answer="7", context_order=[1, 2])])
    comp = _record("comp", comp_parts=["part 1", "part 3"])
    del comp["context_order"]
    _write(tmp_path, [comp], name="32k_financial_comp.jsonl")
    items = load_lara(tmp_path, lengths=("32k",), context_types=("financial",))
    assert [i.task for i in items] == [
        "location",
        "location",
        "comp",
    ]  # tasks in TASKS order, blank line skipped
    a, b, c = items
    assert (a.length, a.context_type, a.doc_id, a.question, a.answer) == (
        "32k", "financial", "acme.txt", "What was the revenue of Acme?", "$2,576,340."
    )  # fmt: skip
    assert a.meta == {"context_order": [3]} and b.meta == {"context_order": [1, 2]}
    assert c.meta == {"comp_parts": ["part 1", "part 3"]}
    assert a.to_record() == _record()


def test_loader_errors_unknown_task_missing_document_bad_json(tmp_path):
    _write(tmp_path, [_record(level="summarise")])
    with pytest.raises(ValueError, match=r"level.*must be one of"):
        load_lara(tmp_path)
    with pytest.raises(ValueError, match="tasks must be one of"):
        load_lara(tmp_path, tasks=("location", "summarise"))
    _write(tmp_path, [_record(file="missing.txt")])
    with pytest.raises(FileNotFoundError, match=r"32k/financial/missing\.txt does not exist"):
        load_lara(tmp_path)
    (tmp_path / "query" / "32k_financial_location.jsonl").write_text('{"type": "financial",\n')
    with pytest.raises(ValueError, match=r"32k_financial_location\.jsonl:1 is not valid JSON"):
        load_lara(tmp_path)
    _write(tmp_path, [_record(level="hallu")])
    with pytest.raises(ValueError, match="has level 'hallu' in the 'location' file"):
        load_lara(tmp_path)
    with pytest.raises(FileNotFoundError, match="query"):
        load_lara(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="context_types must be drawn from"):
        load_lara(tmp_path, context_types=("novel",))


def test_synthetic_items_round_trip_through_the_official_layout(tmp_path):
    data = make_mini_lara(8, seed=3)
    save_lara(tmp_path, data.items, data.documents)
    back = load_lara(tmp_path, lengths=("4k", "16k"))
    key = lambda i: i.meta["uid"]  # noqa: E731
    assert sorted(back, key=key) == sorted(data.items, key=key)
    assert {(i.length, i.context_type, i.doc_id) for i in back} == set(data.documents)


# --------------------------------------------------------------------------------------------- chunking
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400), size=st.integers(2, 60), data=st.data())
def test_chunker_windows_bound_overlap_and_cover(n, size, data):
    overlap = data.draw(st.integers(0, size - 1))
    tokens = [f"t{i}" for i in range(n)]
    text = "  ".join(tokens) + "\n"
    chunks = Chunker(None, size, overlap)(text)
    assert chunks[0].token_start == 0 and chunks[-1].token_end == n
    for c in chunks:
        assert 1 <= c.token_end - c.token_start <= size
        assert c.text.split() == tokens[c.token_start : c.token_end]
        assert text[c.char_start : c.char_end] == c.text
    for a, b in itertools.pairwise(chunks):
        assert a.token_end - b.token_start == overlap  # exactly `overlap` shared tokens
        assert b.token_start > a.token_start
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_chunker_defaults_are_lara_600_and_100():
    chunks = Chunker()(" ".join(str(i) for i in range(1300)))
    assert [(c.token_start, c.token_end) for c in chunks] == [(0, 600), (500, 1100), (1000, 1300)]


# -------------------------------------------------------------------------------------------- retrieval
def _bm25_by_hand(docs, query, k1=1.5, b=0.75):
    n, avg = len(docs), sum(len(d) for d in docs) / len(docs)
    out = []
    for d in docs:
        s = 0.0
        for t in set(query):
            df = sum(t in x for x in docs)
            if df == 0:
                continue
            tf = d.count(t)
            s += (
                math.log(1 + (n - df + 0.5) / (df + 0.5))
                * tf
                * (k1 + 1)
                / (tf + k1 * (1 - b + b * len(d) / avg))
            )
        out.append(s)
    return out


def test_bm25_matches_a_hand_computed_example_and_rapid():
    texts = ["apple apple banana", "banana cherry", "cherry cherry cherry date", "egg"]
    index = DocIndex(Chunker(None, 10, 0)("x") and [_chunk(i, t) for i, t in enumerate(texts)])
    got = index.bm25("apple cherry fig")
    # idf(apple) = ln(1 + 3.5/1.5), idf(cherry) = ln(1 + 2.5/2.5) = ln 2; avg length 2.5
    apple0 = math.log(1 + 3.5 / 1.5) * 2 * 2.5 / (2 + 1.5 * (0.25 + 0.75 * 3 / 2.5))
    assert got[0] == pytest.approx(apple0, rel=1e-12)
    assert got[2] == pytest.approx(math.log(2) * 3 * 2.5 / (3 + 1.5 * (0.25 + 0.75 * 4 / 2.5)), rel=1e-12)
    assert got[3] == 0.0
    docs = [t.split() for t in texts]
    np.testing.assert_allclose(got, _bm25_by_hand(docs, ["apple", "cherry", "fig"]), rtol=1e-12)
    np.testing.assert_allclose(got, bm25_scores(docs, ["apple", "cherry", "fig"]), rtol=1e-12)


def _chunk(i, text):
    from icml25.llm_efficiency.lara import TextChunk

    return TextChunk(i, text, 0, len(text.split()), 0, len(text))


def _doc(n=40, seed=0):
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(60)]
    return ". ".join(" ".join(rng.choice(vocab, 8)) for _ in range(n)) + "."


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 8), ratio=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_hybrid_retriever_returns_k_unique_chunks_with_the_official_split(seed, k, ratio):
    doc, q = _doc(seed=seed), "w3 w17 w41 w5"
    retriever = HybridRetriever(k=k, vector_ratio=ratio, chunker=Chunker(None, 16, 4))
    index = retriever.index(doc)
    got = retriever(index, q)
    assert len(got) == k and len({c.chunk.index for c in got}) == k
    assert [c.rank for c in got] == list(range(k)) and all(
        a.score >= b.score for a, b in itertools.pairwise(got)
    )
    n_dense = int(k * ratio)
    dense_top = set(np.argsort(-index.tfidf_cosine(q), kind="stable")[:n_dense].tolist())
    assert {c.chunk.index for c in got if c.source == "dense"} == dense_top
    if ratio == 0.0:  # pure BM25: the BM25 top k in BM25 order
        bm = index.bm25(q)
        assert [c.chunk.index for c in got] == np.argsort(-bm, kind="stable")[:k].tolist()


def test_reranker_orders_and_k_above_the_number_of_chunks_warns():
    retriever = HybridRetriever(
        k=3, rerank=lambda q, texts: [-len(t) for t in texts], chunker=Chunker(None, 5, 0)
    )
    got = retriever("a b c d e. f g h. i j k l m n o p q", "a f i")
    assert [len(c.text) for c in got] == sorted(len(c.text) for c in got)
    with pytest.warns(UserWarning, match="k=9 exceeds the 2 chunks"):
        got = HybridRetriever(k=9, chunker=Chunker(None, 5, 0))("a b c d e f g", "a")
    assert len(got) == 2
    embed = lambda texts: np.array([[t.count("a"), t.count("g") + 1.0] for t in texts])  # noqa: E731
    got = HybridRetriever(k=1, vector_ratio=1.0, embed=embed, chunker=Chunker(None, 3, 0))("g g g a a a", "a")
    assert got[0].text == "a a a" and got[0].source == "dense"


class _Node:  # the shape of llama-index's TextNode / NodeWithScore (the library is not a dependency)
    def __init__(self, text, start):
        self.text, self.start_char_idx = text, start

    def get_content(self):
        return self.text


class _FakeLlamaRetriever:
    def __init__(self, doc):
        self.doc, self.calls = doc, 0

    def retrieve(self, query):
        self.calls += 1
        hits = [(s, len(set(query.lower().split()) & set(s.lower().split()))) for s in self.doc.split(". ")]
        hits.sort(key=lambda h: -h[1])
        return [
            type("NodeWithScore", (), {"node": _Node(t, self.doc.index(t)), "score": float(sc)})()
            for t, sc in hits[:2]
        ]


def test_llama_index_adapter_maps_nodes_and_builds_once_per_document():
    built = []
    adapter = LlamaIndexRetriever(lambda doc: built.append(_FakeLlamaRetriever(doc)) or built[-1])
    got = adapter(DOC, "the revenue of acme")
    assert [c.text for c in got] == ["The revenue of Acme was 120 dollars", "Acme hired staff."]
    assert [c.rank for c in got] == [0, 1] and got[0].score == 4.0 and got[0].source == "llama_index"
    assert got[0].position == pytest.approx(DOC.index("The revenue") / (len(DOC) - 1))
    adapter(DOC, "acme staff")
    assert len(built) == 1 and built[0].calls == 2
    item = LaraItem("32k", "financial", "location", "acme.txt", "What was the revenue of Acme?", "120", {})
    rows = evaluate_arm(
        [item], lambda m: "120", "rag", LexicalJudge(), documents={"acme.txt": DOC}, retriever=adapter
    )
    assert rows[0]["correct"] and rows[0]["chunks"] == [0, 1]
    assert router_features(item, got, 32_000, 0.9).shape == (len(FEATURE_NAMES),)
    with pytest.raises(TypeError, match="build must return an object with retrieve"):
        LlamaIndexRetriever(lambda doc: object())(DOC, "q")


# ---------------------------------------------------------------------------------------------- prompts
def test_prompts_hold_the_question_and_ranked_chunk_markers():
    item = LaraItem("32k", "financial", "location", "acme.txt", "What was the revenue of Acme?", "120", {})
    rag = build_prompt(item, "rag", chunks=["second best", "first"])[0]["content"]
    assert rag.startswith("Here are some chunks retrieved from a financial statement.")
    assert rag.index("chunk 1: second best.") < rag.index("chunk 2: first.") < rag.index(item.question)
    lc = build_prompt(item, "lc", document=DOC)[0]["content"]
    assert lc.startswith("Read the financial statement below and answer a question.")
    assert DOC in lc and item.question in lc and lc.endswith("Be concise.")
    with pytest.raises(ValueError, match="arm must be 'rag' or 'lc'"):
        build_prompt(item, "both")
    with pytest.raises(ValueError, match="arm='lc' needs the whole document"):
        build_prompt(item, "lc")


# ----------------------------------------------------------------------------------------------- judges
def test_lexical_judge_numbers_refusals_and_spans(caplog):
    judge = LexicalJudge()
    assert normalize_numbers("$2,576,340.") == ["2576340"] == normalize_numbers("2576340")
    assert normalize_numbers("3.50 and −7 and 007") == ["3.5", "-7", "7"]
    assert judge("q", "$2,576,340.", "It was 2576340 dollars.", "location")
    assert not judge("q", "$2,576,340.", "It was 2576341.", "location")
    for refusal in ("The text does not mention it.", "This is not mentioned.", "No information is given.",
                    "It cannot be determined from the text."):  # fmt: skip
        assert is_refusal(refusal) and judge("q", "not mentioned", refusal, "hallu")
        assert not judge("q", "120", refusal, "location")
    assert not judge("q", "not mentioned", "It was 42.", "hallu")
    assert judge("q", "Acme Corp", "The answer is acme corp.", "comp")
    with caplog.at_level(logging.WARNING):
        assert not judge("q", "120", "  ", "location")
    assert "empty prediction" in caplog.text
    with pytest.raises(ValueError, match="task must be one of"):
        judge("q", "a", "a", "trivia")


@settings(max_examples=60, deadline=None)
@given(value=st.integers(0, 10**12), cents=st.integers(0, 99), dollar=st.booleans(), dot=st.booleans())
def test_numbers_match_however_they_are_formatted(value, cents, dollar, dot):
    pretty = (
        ("$" if dollar else "") + f"{value:,}" + (f".{cents:02d}" if cents else "") + ("." if dot else "")
    )
    plain = str(value) + (f".{cents:02d}".rstrip("0") if cents else "")
    assert normalize_numbers(pretty) == [plain]
    assert LexicalJudge()("q", pretty, f"It is {plain} in total", "location")


def test_llm_judge_needs_an_exact_true_or_false(caplog):
    replies = iter(["True", " false. ", "Maybe true", "TRUE!"])
    judge = LLMJudge(lambda messages: next(replies), model="qwen2.5-72b-instruct")
    with caplog.at_level(logging.WARNING):
        assert [judge("q", "a", "p", "location") for _ in range(4)] == [True, False, False, True]
    assert judge.failures == 1 and "not True/False" in caplog.text
    seen = []
    LLMJudge(lambda m: seen.append(m) or "True", "m")("Q?", "not mentioned", "absent", "hallu")
    assert "not mentioned" in seen[0][1]["content"] and "discriminator" in seen[0][0]["content"]

    def boom(messages):
        raise TimeoutError("api down")

    failing = LLMJudge(boom, model="gpt-4o")
    assert failing("q", "a", "p", "location") is False and failing.failures == 1
    with pytest.raises(ValueError, match="model must name the judge"):
        LLMJudge(lambda m: "True", model="")


# --------------------------------------------------------------------------------------------- solvers
def _saved_mini(tmp_path, n=8, seed=1):
    data = make_mini_lara(n, seed=seed, questions_per_doc=4)
    save_lara(tmp_path, data.items, data.documents)
    return data, load_lara(tmp_path, lengths=("4k", "16k"))


def _extractor(messages):
    """A generator double: the mini-LaRA's rule reader over the prompt's context (chunk markers dropped)."""
    content = messages[-1]["content"]
    question = content.rsplit("Question: ", 1)[1].split("\n")[0]
    return extract_answer(question, re.sub(r"chunk \d+: ", "", content.rsplit("Question: ", 1)[0]))


def test_rag_arm_over_a_callable_equals_the_rag_reader(tmp_path):
    data, items = _saved_mini(tmp_path)
    retriever = HybridRetriever(k=3, chunker=Chunker(None, 64, 16))
    rows = evaluate_arm(items, _extractor, "rag", LexicalJudge(), documents=tmp_path, retriever=retriever)
    reader, judge = RagReader(retriever), LexicalJudge()
    for item, row in zip(items, rows, strict=True):
        answer, retrieved = reader(item, data.document(item))
        assert row["prediction"] == answer and row["chunks"] == [c.chunk.index for c in retrieved]
        assert row["correct"] == judge(item.question, item.answer, answer, item.task)
    lc = evaluate_arm(items, _extractor, "lc", None, documents=data.documents)
    assert "correct" not in lc[0] and not any(r["truncated"] for r in lc)
    scored = score_predictions(lc, LexicalJudge())
    assert all(r["correct"] for r in scored)  # the exact extractor over the whole document is always right


def test_long_context_over_the_window_raises_unless_truncated_explicitly(tmp_path):
    data, items = _saved_mini(tmp_path, n=4)
    with pytest.raises(ValueError, match=r"more than the window of 1000.*truncate='middle'"):
        evaluate_arm(items, _extractor, "lc", None, documents=data.documents, window=1000)
    with pytest.warns(UserWarning, match="4 of 4 long contexts were truncated"):
        rows = evaluate_arm(
            items, lambda m: "x", "lc", None, documents=data.documents, window=1000, truncate="middle"
        )
    assert all(r["truncated"] for r in rows)
    text, cut = fit_context(" ".join(f"w{i}" for i in range(100)), 21, truncate="middle")
    assert cut and len(text.split()) <= 21 and text.startswith("w0 ") and text.endswith(" w99")
    assert fit_context("a b", 2) == ("a b", False)


def test_evaluate_bad_inputs(tmp_path):
    data, items = _saved_mini(tmp_path, n=4)
    with pytest.raises(ValueError, match="arm must be 'rag' or 'lc'"):
        evaluate_arm(items, _extractor, "hybrid", None, documents=data.documents)
    with pytest.raises(TypeError, match="generate must return a str"):
        evaluate_arm(items, lambda m: None, "lc", None, documents=data.documents)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluate_arm(items, _extractor, "lc", None, documents=tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="truncate must be None or 'middle'"):
        fit_context("a b c", 2, truncate="head")


transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


def _hf(max_positions=512):
    words = ["[PAD]", "[BOS]", "[EOS]", "[UNK]"] + [f"w{i}" for i in range(60)]
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]"
    )
    cfg = transformers.LlamaConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=2, intermediate_size=64, max_position_embeddings=max_positions,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval(), tokenizer


def test_hf_generator_greedy_window_and_middle_truncation():
    from icml25.llm_efficiency.lara import HFGenerator

    model, tokenizer = _hf()
    with torch_threads(1):
        gen = HFGenerator(model, tokenizer, max_new_tokens=5)
        messages = [{"role": "user", "content": "w1 w2 w3 w4"}]
        ids = gen.prompt_ids(messages)
        assert (
            ids == tokenizer("w1 w2 w3 w4\n\nAnswer:")["input_ids"]
            or ids == tokenizer("w1 w2 w3 w4\nAnswer:")["input_ids"]
        )
        expected = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=5, pad_token_id=0)
        assert gen(messages) == tokenizer.decode(expected[0, len(ids) :], skip_special_tokens=True).strip()
        long = [{"role": "user", "content": " ".join(f"w{i % 60}" for i in range(600))}]
        with pytest.raises(ValueError, match="more than the window of 512"):
            gen(long)
        cut = HFGenerator(model, tokenizer, max_new_tokens=5, truncate="middle")
        with pytest.warns(UserWarning, match="truncated in the middle to 507 tokens"):
            assert isinstance(cut(long), str)
        assert cut.truncations == 1


def test_chunker_with_a_fast_tokenizer_uses_its_offsets():
    _, tokenizer = _hf()
    text = "w1 w2, w3 w4. w5 w6 w7"
    chunks = Chunker(tokenizer, chunk_tokens=4, overlap=1)(text)
    assert [c.text for c in chunks] == ["w1 w2, w3", "w3 w4. w5", "w5 w6 w7"]


# ---------------------------------------------------------------------------------------------- router
def _outcomes(n=200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    lc = (x[:, 0] > 0).astype(int)
    rag = (x[:, 0] <= 0).astype(int) | (x[:, 1] > 1.5).astype(int)
    return x, lc, rag


def test_router_with_separating_features_reaches_the_oracle():
    x, lc, rag = _outcomes()
    router = RagLcRouter().fit(x, lc, rag)
    assert routed_accuracy(router.predict(x), lc, rag) == 1.0 == np.maximum(lc, rag).mean()
    assert router.score(x, np.stack([lc, rag], 1)) == 1.0
    assert (router.predict(x, extra_cost=np.full(len(x), 10.0)) == router.predict(x)).all()  # cost_weight 0
    costly = RagLcRouter(cost_weight=1.0).fit(x, lc, rag)
    assert costly.predict(x, extra_cost=2.0).sum() == 0  # a gain never exceeds 2: all RAG
    assert RagLcRouter(margin=-1.5).fit(x, lc, rag).predict(x).all()


def test_router_with_constant_features_routes_to_the_majority_arm():
    _, lc, rag = _outcomes()
    x = np.ones((len(lc), 3))
    routes = RagLcRouter().fit(x, lc, rag).predict(x)
    assert routes.tolist() == [int(lc.mean() > rag.mean())] * len(lc)
    assert routed_accuracy(routes, lc, rag) == max(lc.mean(), rag.mean())


def test_router_is_a_scikit_learn_estimator():
    x, lc, rag = _outcomes(120)
    search = GridSearchCV(RagLcRouter(), {"margin": [0.0, 0.2]}, cv=2).fit(x, np.stack([lc, rag], 1))
    assert search.best_score_ > 0.9 and search.best_estimator_.n_features_in_ == 3


def test_router_bad_inputs_leave_a_fitted_router_unchanged():
    x, lc, rag = _outcomes()
    router = RagLcRouter().fit(x, lc, rag)
    before = router.predict_gain(x)
    with pytest.raises(
        ValueError, match=r"rag_correct must have one outcome per row of features \(200\), got 199"
    ):
        router.fit(x, lc, rag[:-1])
    with pytest.raises(ValueError, match=r"lc_correct must hold both outcomes.*got only 1"):
        router.fit(x, np.ones_like(lc), rag)
    with pytest.raises(ValueError, match="Input features contains NaN"):
        router.fit(np.where(x > 2, np.nan, x), lc, rag)
    with pytest.raises(ValueError, match="must hold only 0/1"):
        router.fit(x, lc * 2, rag)
    np.testing.assert_array_equal(router.predict_gain(x), before)
    with pytest.raises(ValueError, match="features must have 3 columns"):
        router.predict(x[:, :2])
    with pytest.raises(ValueError, match="This RagLcRouter instance is not fitted yet"):
        RagLcRouter().predict(x)


def test_router_features_and_guideline_rules():
    item = LaraItem(
        "4k", "book", "comp", "d", "Comparing Ann and Bob, which one has the higher rent?", "Ann", {}
    )
    chunks = HybridRetriever(k=2, chunker=Chunker(None, 6, 0))(
        "Ann rent 5 here now x. Bob wage 3 there y z.", item.question
    )
    f = router_features(item, chunks, 4096, 0.8)
    named = dict(zip(FEATURE_NAMES, f, strict=True))
    assert named["log2_context_tokens"] == 12 and named["context_book"] == 1 and named["context_paper"] == 0
    assert named["cue_comparison"] == 1 and named["cue_reasoning"] == 0 and named["model_strength"] == 0.8
    # content terms: ann, bob, comparing, higher, rent -> ann, rent, bob found; pairs (ann, rent) only
    assert named["term_coverage"] == pytest.approx(3 / 5) and named["pair_coverage"] == pytest.approx(1 / 10)
    assert named["position_spread"] == pytest.approx(0.5) and named["position_mean"] == pytest.approx(0.5)
    assert question_cues("By how much did the rent of Ann increase from 2001 to 2003?") == (0.0, 1.0)
    assert [guideline_route(t, 4000, 0.9) for t in ("location", "reasoning", "comp", "hallu")] == [0, 1, 1, 0]
    assert guideline_route("comp", 4000, 0.5) == 0  # a weak model: RAG
    with pytest.raises(ValueError, match="model_strength must be in"):
        router_features(item, chunks, 4096, 1.5)


# ---------------------------------------------------------------------------------------- mini-LaRA
def test_mini_lara_is_answerable_and_the_simulated_reader_is_frozen_and_deterministic():
    data = make_mini_lara(16, seed=5)
    assert [i.task for i in data.items[:4]] == ["location", "reasoning", "comp", "hallu"]
    judge = LexicalJudge()
    assert all(
        judge(i.question, i.answer, extract_answer(i.question, data.document(i)), i.task) for i in data.items
    )
    reader = SimulatedLCReader(LC_READERS["weak"], seed=0)
    answers = [reader(i, data.document(i)) for i in data.items]
    assert answers == [SimulatedLCReader(LC_READERS["weak"], seed=0)(i, data.document(i)) for i in data.items]
    p = LC_READERS["strong"]
    assert p.miss_probability(0.5, 16000) == pytest.approx(0.05 + 0.08 * 2 + 0.15)
    assert p.miss_probability(0.0, 4000) == pytest.approx(0.05)
    perfect = SimulatedLCReader(type(p)("oracle", 0.0, 0.0, 0.0, 0.0))
    assert all(judge(i.question, i.answer, perfect(i, data.document(i)), i.task) for i in data.items)
    with pytest.raises(ValueError, match="n_items must be a positive multiple"):
        make_mini_lara(10)


# ------------------------------------------------------------------------------------- reproduction
def test_quick_reproduction_passes():
    report = experiment.run(quick=True, seed=0)
    m = report.metrics
    assert report.passed, report.checks
    assert m["router"] >= m["best_fixed"] - 2 and m["oracle"] >= m["router"]
    assert m["rag_hallu"] > m["lc_hallu"] and m["lc_comp"] > m["rag_comp"] and m["rag_16k"] > m["lc_16k"]
    assert "SIMULATED" in report.notes


def test_quick_gate_fails_for_routers_fit_on_swapped_arm_logs():
    report = experiment.run(quick=True, seed=0, variant="swap_labels")
    assert report.failed_checks == ["router >= best fixed arm - 2 points"]


def test_full_threshold_holds_the_routing_checks():
    text = experiment.threshold(quick=False)
    assert "router >= best fixed arm + 3 points" in text and "router >= best-arm table + 2 points" in text
    assert "router without retrieval features <= best-arm table + 1 point" in text and "rule" not in text
    assert "router on shuffled features <= best fixed arm + 1 point" in text


def test_run_writes_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    report = experiment.run(quick=True, seed=0, out_dir=tmp_path)
    assert [p.name for p in report.figures] == ["p38_lara.png"] and report.figures[0].stat().st_size > 0


def test_best_arm_table_routes_each_cell_to_its_better_arm_out_of_fold():
    # cells: a (20) only LC right, b (10) only RAG right, d (10) both right (a tie), c (1) both wrong
    keys = np.array(["a"] * 20 + ["b"] * 10 + ["d"] * 10 + ["c"])
    lc = np.array([1] * 20 + [0] * 10 + [1] * 10 + [0])
    rag = np.array([0] * 20 + [1] * 10 + [1] * 10 + [0])
    routes = experiment.table_routes(keys, lc, rag, folds=5, seed=0)
    assert routes[:20].all() and not routes[20:30].any()  # a -> LC, b -> RAG
    # a tie (d) and a cell absent from the training folds (c): the training folds' better fixed arm, LC here
    assert routes[30:].all()


@pytest.mark.slow
def test_full_reproduction_passes():
    """Full mode (600 queries, 5-fold CV, seed 0): every check holds; the guideline rule router is reported."""
    report = experiment.run(quick=False, seed=0)
    assert report.passed, report.checks
    m = report.metrics
    assert m["table"] > m["best_fixed"] and m["table"] > m["rule"]  # the table is the stronger baseline
    assert m["router"] >= m["table"] + 2 and m["router_noret"] <= m["table"] + 1


def test_the_retrieval_primitives_are_one_shared_object_and_import_no_other_paper() -> None:
    """Issue 82: embedding_scores and words live in llm_efficiency.common.retrieval; RAPID's (P03) and LaRA's
    (P38) retrieval modules re-export the very same objects, and LaRA's imports no RAPID module."""
    import subprocess
    import sys

    from icml25.llm_efficiency.common import retrieval as common
    from icml25.llm_efficiency.lara import retrieval as lara_retrieval
    from icml25.llm_efficiency.rapid import retrieval as rapid_retrieval

    assert lara_retrieval.embedding_scores is rapid_retrieval.embedding_scores is common.embedding_scores
    assert lara_retrieval.words is rapid_retrieval.words is common.words
    code = (
        "import sys, icml25.llm_efficiency.lara.retrieval\n"
        "print(sorted(m for m in sys.modules if m.startswith('icml25.llm_efficiency.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "rapid" not in out and "icml25.llm_efficiency.common.retrieval" in out
    with pytest.raises(TypeError, match="chunk_tokens must be an int >= 1"):
        Chunker(None, 2.0, 0)
    with pytest.raises(ValueError, match=r"vector_ratio must be a finite float in \[0\.0, 1\.0\]"):
        HybridRetriever(vector_ratio=float("nan"))
    with pytest.raises(ValueError, match=r"f1_threshold must be a finite float in \[0\.0, 1\.0\]"):
        LexicalJudge(1.5)
