"""P12 MVoT: codebook distances, the token discrepancy loss against loops and closed forms, the combined loss,
interleaved examples, the k-means tokenizer, the image-block mask, bad inputs, and the quick reproduction's
verdict (and a broken variant's failure)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import NotFittedError

from icml25.generative_models import mvot
from icml25.generative_models.experiments import mvot as exp

V, K = 12, 5
IDS = torch.tensor([9, 3, 11, 6, 4])  # LM id of codebook entry k (deliberately not sorted)


def _codebook(seed: int = 0, k: int = K, d: int = 3) -> torch.Tensor:
    return torch.randn(k, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _loop_loss(logits, labels, ids, dist, shift=True):
    """Reference: one position at a time, the LM-id -> code map looked up by search."""
    terms = []
    b, t, _ = logits.shape
    for i in range(b):
        for j in range(1 if shift else 0, t):
            lab = int(labels[i, j])
            if lab not in ids.tolist():
                continue
            row = logits[i, j - 1 if shift else j]
            p = torch.softmax(torch.stack([row[int(c)] for c in ids]), 0)
            k_star = ids.tolist().index(lab)
            terms.append(sum(p[c] * dist[k_star, c] for c in range(len(ids))))
    return torch.stack(terms).mean() if terms else torch.tensor(0.0)


def test_distance_matrix_properties_and_squared() -> None:
    e = _codebook()
    d = mvot.codebook_distance_matrix(e)
    assert d.dtype == torch.float32 and d.shape == (K, K)
    torch.testing.assert_close(d, d.T)
    assert (d >= 0).all() and (d.diagonal() == 0).all()
    torch.testing.assert_close(d, torch.cdist(e, e).float(), atol=1e-6, rtol=1e-6)
    d2 = mvot.codebook_distance_matrix(e, squared=True, dtype=torch.float64)
    torch.testing.assert_close(d2, mvot.codebook_distance_matrix(e, dtype=torch.float64) ** 2)


def test_loss_zero_on_confident_correct_and_equals_row_entry_on_wrong_code() -> None:
    dist = mvot.codebook_distance_matrix(_codebook())
    labels = torch.tensor([[-100, int(IDS[2])]])
    logits = torch.zeros(1, 2, V)
    logits[0, 0, IDS[2]] = 100.0
    assert float(mvot.token_discrepancy_loss(logits, labels, IDS, dist)) == pytest.approx(0.0, abs=1e-6)
    logits = torch.zeros(1, 2, V)
    logits[0, 0, IDS[4]] = 100.0
    assert float(mvot.token_discrepancy_loss(logits, labels, IDS, dist)) == pytest.approx(
        float(dist[2, 4]), rel=1e-5
    )


def test_hand_computed_three_codes() -> None:
    codebook = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]])  # distances 3, 4, 5
    dist = mvot.codebook_distance_matrix(codebook)
    ids = torch.tensor([1, 2, 3])
    logits = torch.zeros(1, 2, 5)
    logits[0, 0, 1:4] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    logits[0, 0, 0] = 7.0  # a text column: must not take mass
    labels = torch.tensor([[-100, 2]])  # code 1
    expected = 0.5 * 3.0 + 0.3 * 0.0 + 0.2 * 5.0
    assert float(mvot.token_discrepancy_loss(logits, labels, ids, dist)) == pytest.approx(expected, rel=1e-6)


def test_text_positions_and_columns_get_no_gradient() -> None:
    dist = mvot.codebook_distance_matrix(_codebook())
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, V, generator=g, requires_grad=True)
    labels = torch.tensor([[-100, 0, 9, 1, 3, 2], [-100, 11, 0, 4, -100, 7]])  # text ids 0, 1, 2, 7 mixed in
    loss = mvot.token_discrepancy_loss(logits, labels, IDS, dist)
    loss.backward()
    text_cols = [c for c in range(V) if c not in IDS.tolist()]
    assert (logits.grad[..., text_cols] == 0).all()
    shifted_img = torch.isin(labels[:, 1:], IDS)
    assert (logits.grad[:, :-1][~shifted_img] == 0).all() and (logits.grad[:, -1] == 0).all()
    bumped = logits.detach().clone()
    bumped[..., text_cols] += 50.0  # softmax over image columns only: text logits do not change L_D
    torch.testing.assert_close(mvot.token_discrepancy_loss(bumped, labels, IDS, dist), loss.detach())


@pytest.mark.parametrize("shift", [True, False])
def test_matches_loop_implementation_with_permuted_mapping(shift) -> None:
    dist = mvot.codebook_distance_matrix(_codebook(2))
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 7, V, generator=g)
    labels = torch.randint(0, V, (3, 7), generator=g)
    got = mvot.token_discrepancy_loss(logits, labels, IDS, dist, shift=shift)
    torch.testing.assert_close(got, _loop_loss(logits, labels, IDS, dist, shift).float())
    # the map is applied before indexing D: a sorted-order assumption gives a different (wrong) value
    wrong = mvot.token_discrepancy_loss(logits, labels, IDS.sort().values, dist, shift=shift)
    assert not torch.allclose(got, wrong)


def test_no_image_labels_gives_zero_with_graph() -> None:
    dist = mvot.codebook_distance_matrix(_codebook())
    logits = torch.randn(2, 4, V, requires_grad=True)
    labels = torch.tensor([[0, 1, 2, -100], [-100, -100, 7, 8]])
    loss = mvot.token_discrepancy_loss(logits, labels, IDS, dist)
    assert float(loss.detach()) == 0.0 and not math.isnan(float(loss.detach()))
    loss.backward()
    assert (logits.grad == 0).all()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.floats(0.1, 10.0))
def test_loss_bounded_by_row_extremes_and_scale_equivariant(seed, k, scale) -> None:
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(k, 3, generator=g)
    ids = torch.randperm(k + 3, generator=g)[:k]
    dist = mvot.codebook_distance_matrix(e)
    logits = torch.randn(2, 5, k + 3, generator=g)
    labels = ids[torch.randint(0, k, (2, 5), generator=g)]
    loss = mvot.token_discrepancy_loss(logits, labels, ids, dist)
    assert 0.0 <= float(loss) <= float(dist.max()) + 1e-5
    scaled = mvot.token_discrepancy_loss(logits, labels, ids, mvot.codebook_distance_matrix(scale * e))
    assert float(scaled) == pytest.approx(scale * float(loss), rel=1e-4, abs=1e-6)


def test_mvot_loss_parts() -> None:
    dist = mvot.codebook_distance_matrix(_codebook())
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 6, V, generator=g)
    labels = torch.tensor([[-100, 0, 9, 1, 3, 2], [-100, 11, 0, 4, -100, 7]])
    parts = mvot.MVoTLoss(dist, IDS, weight=0.5)(logits, labels)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(parts["ce"], ce)
    torch.testing.assert_close(parts["discrepancy"], mvot.token_discrepancy_loss(logits, labels, IDS, dist))
    torch.testing.assert_close(parts["loss"], ce + 0.5 * parts["discrepancy"])
    torch.testing.assert_close(mvot.MVoTLoss(dist, IDS, weight=0.0)(logits, labels)["loss"], ce)


def test_build_interleaved_example_layout() -> None:
    ex = mvot.build_interleaved_example(
        [("go left", torch.tensor([0, 2])), ([7], torch.tensor([4]))], image_token_ids=IDS, boi_id=1, eoi_id=2,
        prompt=[torch.tensor([3]), "where"], answer="yes", vocab={"go": 5, "left": 6, "where": 8, "yes": 10},
        bos_id=0, eos_id=7,
    )  # fmt: skip
    ids = [0, 1, 6, 2, 8, 5, 6, 1, 9, 11, 2, 7, 1, 4, 2, 10, 7]
    assert ex["input_ids"].tolist() == ids
    assert ex["labels"].tolist() == [-100] * 5 + ids[5:]
    assert ex["attention_mask"].tolist() == [1] * len(ids)


def test_kmeans_tokenizer_roundtrip_and_recovers_colours() -> None:
    rng = np.random.default_rng(0)
    colours = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    cells = rng.integers(0, 3, (40, 2, 2))
    images = np.repeat(np.repeat(colours[cells], 2, 1), 2, 2).astype(np.float32)  # (40, 4, 4, 3)
    tok = mvot.KMeansVQTokenizer(3, 2, seed=0).fit(images)
    codes = tok.encode(images)
    assert codes.shape == (40, 4)
    torch.testing.assert_close(tok.decode(codes, (2, 2)), torch.as_tensor(images), atol=1e-5, rtol=0)
    assert sorted(map(tuple, tok.codebook_[:, :3].round().int().tolist())) == [
        (0, 0, 1),
        (0, 1, 0),
        (1, 0, 0),
    ]


def test_image_block_mask_forces_fixed_length_blocks() -> None:
    boi, eoi = 1, 2
    rows = torch.tensor([[0, 5, boi, 9, 3], [0, boi, 9, 3, 11], [boi, 9, eoi, 5, 5]])
    mask = mvot.image_block_mask(rows, V, IDS, boi, eoi, n_tokens=3)
    img = torch.zeros(V, dtype=torch.bool)
    img[IDS] = True
    assert torch.equal(mask[0], img)  # 2 of 3 image tokens emitted
    assert mask[1].tolist() == [c == eoi for c in range(V)]  # 3 emitted: close the block
    assert mask[2].all()  # outside a block: free


def test_bad_inputs() -> None:
    e = _codebook()
    dist = mvot.codebook_distance_matrix(e)
    logits, labels = torch.randn(1, 3, V), torch.tensor([[-100, 9, 3]])
    with pytest.raises(ValueError, match="image_token_ids must be distinct"):
        mvot.token_discrepancy_loss(logits, labels, torch.tensor([9, 3, 9, 6, 4]), dist)
    with pytest.raises(ValueError, match=r"distance must be \(K, K\) with K = len\(image_token_ids\) = 4"):
        mvot.token_discrepancy_loss(logits, labels, IDS[:4], dist)
    with pytest.raises(ValueError, match="distance must be a square"):
        mvot.token_discrepancy_loss(logits, labels, IDS, dist[:, :4])
    with pytest.raises(ValueError, match="logits must be"):
        mvot.token_discrepancy_loss(logits, labels[:, :2], IDS, dist)
    with pytest.raises(ValueError, match=r"labels must be token ids in \[0, 12\)"):
        mvot.token_discrepancy_loss(logits, torch.tensor([[-100, 9, 40]]), IDS, dist)
    with pytest.raises(ValueError, match="image_token_ids must index the vocabulary"):
        mvot.token_discrepancy_loss(logits, labels, torch.tensor([9, 3, 11, 6, 20]), dist)
    bad = e.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match="codebook must be finite"):
        mvot.codebook_distance_matrix(bad)
    with pytest.raises(ValueError, match=r"weight must be a finite float in \[0, inf\), got -0.1"):
        mvot.MVoTLoss(dist, IDS, weight=-0.1)
    with pytest.raises(TypeError, match="labels must be a int tensor"):
        mvot.token_discrepancy_loss(logits, labels.float(), IDS, dist)
    with pytest.raises(ValueError, match=r"steps\[0\] codes must hold codebook ids"):
        mvot.build_interleaved_example([([5], torch.tensor([7]))], image_token_ids=IDS, boi_id=1, eoi_id=2)
    with pytest.raises(NotFittedError, match="not fitted"):
        mvot.KMeansVQTokenizer(3, 2).encode(np.zeros((1, 4, 4, 3)))
    with pytest.raises(ValueError, match="divisible by patch=3"):
        mvot.KMeansVQTokenizer(3, 3).fit(np.zeros((2, 4, 4, 3)))


def test_quick_reproduction_passes_and_broken_variant_fails() -> None:
    report = exp.run(quick=True, seed=0)
    assert report.passed, report.metrics
    broken = exp.evaluate(exp.QUICK, seed=0, broken=True)  # L_D with a shuffled LM-id -> code map
    assert not broken.passed
    failed = [k for k, v in broken.checks.items() if not v]
    assert failed == [exp.checks(exp.QUICK)[1].name]
    assert broken.metrics["ld_expected_distance"] > report.metrics["ld_expected_distance"]
