"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: the batched stage 2.

The fast PyTorch path of stage 2 (what the public ops run when the Triton backend is not selected, e.g. on
CPU): the computation of :func:`icml25.kernels.sparse_attention.reference.sparse_flash_forward` (the
specification and test oracle) without its Python loop over LUT steps. Programs (one per ``(b, h, Q
block)``) are grouped by their number ``c`` of kept K blocks and take one of three routes:

* **grouped** (non-causal): a program whose λ test provably computes every tile by a norm bound
  (:func:`_range_no_skip`: ``2·max|q|·max|k| < λ``, two ``O(L·d)`` passes per call; always for
  ``pv_threshold=None``, and for the default λ = 50 on ordinary inputs) is plain softmax attention over
  its kept keys. Programs that keep the same K/V tiles (neighbouring Q blocks of one cluster, a whole
  dense mask, the query heads of one GQA group) form a set: its tiles are gathered once and its Q blocks
  run as one longer query through ``scaled_dot_product_attention`` (PyTorch's fused CPU flash kernel), sets
  with equal sizes batched in one call (:func:`_grouped`).
* **fused**: the other chunks that the per-tile bound of :func:`_no_skip` clears and that need no element
  mask: one ``scaled_dot_product_attention`` call over the gathered keys. Causal heads that keep every
  valid block run as one ``is_causal=True`` call per head.
* **explicit**: scores as one batched matmul (chunks bounded by ``max_chunk`` elements), element masks on
  the trailing tiles that need them (the LUT is ascending), the λ test for every tile at once, a masked
  exp2 softmax and a second batched matmul.

Why this equals the tile loop:

* **λ skip.** The loop skips tile ``t`` of a program when every real row's tile maximum ``M_t`` lies more
  than λ below its running maximum ``m_old`` over the *computed* tiles. A skipped tile never raises a
  real row's maximum, so ``m_old`` is the exclusive prefix maximum of the tile maxima over *all* earlier
  tiles: computed with ``cummax`` for every tile at once, the decisions are the loop's. Skipped tiles are
  masked out of the softmax (the loop adds neither their ``l`` nor their ``P·V``).
* **Online softmax.** The loop's rescaled accumulation is, in exact arithmetic, the softmax over the
  computed columns with the final row maximum, which both routes compute (fp32 rounding differs).
* **INT8.** The loop multiplies integer dot products by ``q_scale · k_scale`` per tile; here the operands
  are the INT8 values already multiplied by their scales (:func:`operands`: the reference's quantization,
  element for element, computed in place in fp32 with no INT8 tensor) and the GEMMs run in fp32. Products
  of INT8 values summed over ``d`` are exact in fp32, so only the order of the scale multiplication
  differs: the method's quantization error (what P01 measures, the GPU kernel's) is kept. It costs ≈ 1 ms
  per call on one CPU thread at L = 4096, d = 64 (≈ 5% of a top-k 0.1 call; ``quantize_qk=False`` saves
  it). CPU INT8 GEMM (``torch._int_mm``) was measured and not used: with ``d = 64`` its time plus the
  INT32→fp32 pass matched the fp32 GEMM, and it has no batched or fused-softmax form.

Memory: the explicit route's score chunk is bounded by ``max_chunk`` elements (default 2²¹, 8 MiB), the
fused route's gathered K/V by the same number of ``K`` rows × ``d``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from icml25.kernels.sparse_attention import reference
from icml25.kernels.sparse_attention.reference import pad_to_blocks

_NEG_INF = float("-inf")
_LN2 = math.log(2.0)  # scores in log2 units -> natural units
MAX_CHUNK = 1 << 21  # score elements per explicit chunk (fp32: 8 MiB); gathered K elements per fused chunk


def _rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[idx]`` along dim 0: a view when ``idx`` is an ascending run of consecutive indices, else a copy."""
    n = idx.numel()
    first, last = int(idx[0]), int(idx[-1])
    if last - first == n - 1 and (n == 1 or bool((idx[1:] - idx[:-1] == 1).all())):
        return x[first : last + 1]
    return x.index_select(0, idx)


def operands(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float,
    k_mean: torch.Tensor | None,
    quantize: bool,
    block_q: int,
    block_k: int,
    q_group: int,
) -> tuple[torch.Tensor, None, torch.Tensor, None]:
    """Stage 2's Q/K operands for :func:`sparse_flash_forward`, in fp32: ``(q_op, None, k_op, None)``.

    Without ``quantize`` these are :func:`icml25.kernels.sparse_attention.reference.quantize_qk`'s float
    operands. With it, they are its INT8 operands already multiplied by their scales (what this module
    computes with anyway), element for element: the same products, divisions and half-away-from-zero
    rounding as :func:`icml25.kernels.sparse_attention.reference.quantize_int8`, done in place on one fp32
    copy per tensor, without the INT8 tensor and its dequantization pass (on CPU each fresh 1 MiB temporary
    also costs page faults).
    """
    if not quantize:
        return reference.quantize_qk(
            q, k, scale=scale, smooth_k=k_mean is not None, quantize=False, block_q=block_q,
            block_k=block_k, k_mean=k_mean,
        )  # fmt: skip
    # Fresh fp32 copies (quantized in place below); padding rows stay 0. The products are the reference's
    # (x − mean)·quant_scale, with K's quant_scale 1 left out (a product by 1 is exact).
    q_f = pad_to_blocks(q.float() * (scale * reference.LOG2E), block_q)
    k_f = k.float() - k_mean[:, :, None, :] if k_mean is not None else k.to(torch.float32, copy=True)
    k_f = pad_to_blocks(k_f, block_k)
    return _fake_quantize(q_f, q_group), None, _fake_quantize(k_f, block_k), None


def _fake_quantize(x: torch.Tensor, group: int) -> torch.Tensor:
    """``quantize_int8`` of each group of ``group`` rows of ``x [B, H, L, d]`` (``L % group == 0``), then
    multiplied back by its scale; in place (``x`` must be a fresh tensor)."""
    B, H, L, d = x.shape
    y = x.view(B, H, L // group, group, d)
    s = y.abs().amax(dim=(-2, -1), keepdim=True).div_(127.0)
    s = torch.where(s > 0, s, 1.0)
    y.div_(s).add_(torch.copysign(torch.tensor(0.5, device=x.device), y)).trunc_().clamp_(-127, 127)
    return y.mul_(s).view(B, H, L, d)


def sparse_flash_forward(
    q_op: torch.Tensor,
    q_scale: torch.Tensor | None,
    k_op: torch.Tensor,
    k_scale: torch.Tensor | None,
    v: torch.Tensor,
    lut: torch.Tensor,
    count: torch.Tensor,
    *,
    lq: int,
    lk: int,
    is_causal: bool,
    pv_threshold: torch.Tensor,
    block_q: int,
    block_k: int,
    max_chunk: int | None = None,
    use_sdpa: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 2 without a tile loop; arguments and results as in the reference ``sparse_flash_forward``.

    ``max_chunk`` bounds the score elements materialised at once (default :data:`MAX_CHUNK`; a program
    whose kept columns exceed it is processed alone). ``use_sdpa=False`` computes every chunk explicitly
    (the tests compare both routes).
    """
    B, H, lq_pad, d = q_op.shape
    hkv, nk = k_op.shape[1], lut.shape[-1]
    nq, group, device = lq_pad // block_q, H // hkv, q_op.device
    n_prog = B * H * nq
    # fp32 operands, dequantized once (INT8 emulation: see the module docstring); scores in log2 units.
    qf = q_op.float()
    if q_scale is not None:
        qf = (qf.view(B, H, q_scale.shape[-1], -1, d) * q_scale[..., None, None]).view(B, H, lq_pad, d)
    kf = k_op.float()
    if k_scale is not None:
        kf = kf.view(B, hkv, nk, block_k, d) * k_scale[..., None, None]
    kb = kf.reshape(B * hkv * nk, block_k, d)
    vb = pad_to_blocks(v, block_k).float().reshape(B * hkv * nk, block_k, d)
    prog = torch.arange(n_prog, device=device)
    h_idx = (prog // nq) % H
    lam = pv_threshold.float().to(device)[h_idx]
    x = _Ctx(
        qb=qf.reshape(n_prog, block_q, d), kb=kb, vb=vb, lut=lut.reshape(n_prog, nk).long(),
        kv_base=(prog // (H * nq) * hkv + h_idx // group) * nk, i_idx=prog % nq, lam=lam,
        out=torch.zeros(n_prog, block_q, d, device=device),
        skipped=torch.zeros(n_prog, dtype=torch.int32, device=device),
        lq=lq, lk=lk, is_causal=is_causal, block_q=block_q, block_k=block_k, v_dtype=v.dtype,
        sdpa=use_sdpa and v.dtype == torch.float32,
    )  # fmt: skip
    count_f = count.reshape(n_prog).long()
    if x.sdpa and is_causal:
        count_f = torch.where(_causal_dense_heads(x, count_f, B=B, H=H, hkv=hkv), 0, count_f)
    limit = MAX_CHUNK if max_chunk is None else max_chunk
    # Non-causal programs that provably skip nothing (cheap norm bound) go to the grouped SDPA route.
    cleared = _range_no_skip(x) if x.sdpa and not is_causal else None
    order = torch.argsort(count_f, stable=True)
    values, sizes = torch.unique_consecutive(count_f[order], return_counts=True)
    start = 0
    for c, size in zip(values.tolist(), sizes.tolist()):
        members = order[start : start + size]
        start += size
        if c == 0:  # no kept block (or done above): the rows output 0 (as in the loop)
            continue
        if cleared is not None:
            ok = cleared.index_select(0, members)
            if bool(ok.any()):
                _grouped(x, members[ok], c, limit)
                members = members[~ok]
                size = members.numel()
                if size == 0:
                    continue
        per = max(1, limit // (block_q * c * block_k))
        if x.sdpa:  # the fused route materialises no scores: chunks bounded by the gathered K/V instead
            tiles = x.kv_base[members][:, None] + x.lut[members, :c]
            per = size if bool((tiles == tiles[:1]).all()) else max(per, limit // (c * block_k * d))
        for s in range(0, size, per):
            _chunk(x, members[s : s + per], c, limit)
    o = x.out.view(B, H, lq_pad, d)[:, :, :lq]
    return o.to(v.dtype), x.skipped.view(B, H, nq)


@dataclass
class _Ctx:
    """The per-call operands and outputs shared by the chunks (programs flattened: p = (b, h, i))."""

    qb: torch.Tensor  # [P, block_q, d] fp32 Q in log2 units (dequantized)
    kb: torch.Tensor  # [B*Hkv*nk, block_k, d] fp32 K blocks (dequantized, zero padded)
    vb: torch.Tensor  # [B*Hkv*nk, block_k, d] fp32 V blocks (zero padded)
    lut: torch.Tensor  # [P, nk] int64
    kv_base: torch.Tensor  # [P] first K-block row of the program's K/V head
    i_idx: torch.Tensor  # [P] Q-block index
    lam: torch.Tensor  # [P] λ
    out: torch.Tensor  # [P, block_q, d] fp32
    skipped: torch.Tensor  # [P] int32
    lq: int
    lk: int
    is_causal: bool
    block_q: int
    block_k: int
    v_dtype: torch.dtype
    sdpa: bool  # route chunks that provably skip nothing to scaled_dot_product_attention
    bounds: tuple[torch.Tensor, torch.Tensor] | None = None  # per K block: (centre [T, d], radius [T])

    def tile_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``c`` of each K block's real keys and the largest distance ``R`` of one of them to it."""
        if self.bounds is None:
            T, bk, _ = self.kb.shape
            cols = torch.arange(bk, device=self.kb.device)
            nk = self.lut.shape[1]
            real = ((torch.arange(T, device=self.kb.device) % nk)[:, None] * bk + cols < self.lk)[..., None]
            n_real = real.sum(dim=1).clamp(min=1)
            centre = (self.kb * real).sum(dim=1) / n_real
            radius = ((self.kb - centre[:, None]).norm(dim=-1, keepdim=True) * real).amax(dim=1).squeeze(-1)
            self.bounds = (centre, radius)
        return self.bounds


def _range_no_skip(x: _Ctx) -> torch.Tensor:
    """``[P]`` bool: non-causal programs whose λ test provably computes every kept tile, from norms alone.

    Every score of a real row ``r`` lies in ``[−|q_r|·K, |q_r|·K]`` (``K``: the largest key norm of its
    K/V head), so a tile's row maximum is never more than ``2·|q_r|·K`` below the row's running maximum:
    the loop computes every tile when ``2·max_r |q_r|·K < λ`` (with a relative rounding margin of 1e-3).
    Two norm passes, ``O(L·d)`` once per call (the per-tile bound of :func:`_no_skip` costs a product per
    tile and chunk); programs this bound cannot clear go through the routes below it. Only non-causal: a
    causal tile may be visible to padded rows only, which the loop counts as skipped.
    """
    if not bool(torch.isfinite(x.lam).any()):
        return torch.ones_like(x.lam, dtype=torch.bool)
    nk = x.lut.shape[1]
    q_norm = x.qb.norm(dim=-1).amax(dim=-1)  # [P]; padded rows are 0
    k_norm = x.kb.norm(dim=-1).view(-1, nk * x.block_k).amax(dim=-1)  # [B*Hkv]; padded keys are 0
    bound = 2.0 * q_norm * k_norm[x.kv_base // nk]
    return bound * (1.0 + 1e-3) + 1e-3 < x.lam


def _grouped(x: _Ctx, idx: torch.Tensor, c: int, limit: int) -> None:
    """Programs ``idx``, each with ``c`` kept K blocks and no λ skip (non-causal): plain softmax attention
    over their gathered keys, through ``scaled_dot_product_attention`` (PyTorch's fused CPU flash kernel).

    Programs that keep the same K/V tiles (neighbouring Q blocks of one cluster, every block of a dense
    mask) form one *set*: its tiles are gathered once and its Q blocks run as one longer query (on one CPU
    thread ≈ 20% less time per score than separate 128-row queries at L = 4k). Sets are batched by their
    number of members; a set holding the ragged last K block is cut to the real keys (the LUT is
    ascending, so that block is the set's last tile and its zero padding the last columns).
    """
    bq, bk, d, nk = x.block_q, x.block_k, x.qb.shape[-1], x.lut.shape[1]
    tiles = x.kv_base.index_select(0, idx)[:, None] + x.lut.index_select(0, idx)[:, :c]  # [n, c] rows of kb
    sets, inv, members = torch.unique(tiles, dim=0, return_inverse=True, return_counts=True)
    progs = idx[torch.argsort(inv, stable=True)]  # programs ordered by set
    first = torch.cumsum(members, 0) - members  # each set's first position in progs
    pad = (bk - x.lk % bk) % bk
    ragged = (sets[:, -1] % nk == nk - 1) & (pad > 0)
    key = members * 2 + ragged.long()
    per = max(1, limit // (c * bk * d))  # sets per call: gathered K elements bounded by `limit`
    for value in torch.unique(key).tolist():
        which = torch.nonzero(key == value).flatten()
        m, keys = value // 2, c * bk - (pad if value % 2 else 0)
        for s in range(0, which.numel(), per):
            w = which[s : s + per]
            n_s = w.numel()
            p = progs[(first[w][:, None] + torch.arange(m, device=idx.device)).reshape(-1)]  # [n_s*m]
            t = sets[w].reshape(-1)
            k_g = _rows(x.kb, t).view(n_s, 1, c * bk, d)[:, :, :keys]
            v_g = _rows(x.vb, t).view(n_s, 1, c * bk, d)[:, :, :keys]
            q_g = _rows(x.qb, p).view(n_s, 1, m * bq, d)
            # Scores in log2 units -> scale ln 2.
            o = F.scaled_dot_product_attention(q_g, k_g, v_g, scale=_LN2)
            x.out.index_copy_(0, p, o.view(n_s * m, bq, d))


def _no_skip(x: _Ctx, q_c: torch.Tensor, rows: torch.Tensor, blocks: torch.Tensor, tiles: torch.Tensor,
             lam: torch.Tensor, valid: torch.Tensor | None = None) -> bool:  # fmt: skip
    """Whether the λ test provably computes every kept tile of these programs (then dense attention over the
    kept tiles is the loop's result), from bounds instead of scores.

    A row's maximum over a K block lies between ``q·c`` and ``q·c + |q|·R``; the loop computes tile ``t``
    when some real row that sees the whole tile has ``M_t − max_{t'<t} M_t' ≥ −λ`` (or nothing before it),
    which holds when ``q·c_t − max_{t'<t}(q·c_t' + |q|·R_t') ≥ −λ`` (plus a rounding margin).
    ``q_c [n, block_q, d]``, ``rows [n, block_q]``, ``blocks``/``tiles [n, c]``, ``valid [n, c]`` (tiles
    that exist; default all).
    """
    if not bool(torch.isfinite(lam).any()):
        return True
    centre, radius = x.tile_bounds()
    lower = torch.bmm(q_c, centre[tiles].transpose(1, 2))  # [n, block_q, c]
    upper = lower + q_c.norm(dim=-1, keepdim=True) * radius[tiles][:, None, :]
    if valid is not None:
        upper = upper.masked_fill(~valid[:, None, :], _NEG_INF)
    prefix = torch.cat([torch.full_like(upper[..., :1], _NEG_INF), upper.cummax(dim=-1).values[..., :-1]], -1)
    gap = torch.where(prefix == _NEG_INF, math.inf, lower - prefix)
    sees = (rows < x.lq)[:, :, None]
    if x.is_causal:
        last_col = ((blocks + 1) * x.block_k - 1).clamp(max=x.lk - 1)
        sees = sees & (last_col[:, None, :] <= rows[:, :, None])
    gap = gap.masked_fill(~sees, _NEG_INF)
    margin = 1e-3 * (1.0 + float(upper.masked_fill(upper == _NEG_INF, 0).abs().amax()))
    ok = gap.amax(dim=1) >= -lam[:, None] + margin
    if valid is not None:
        ok = ok | ~valid
    return bool(ok.all())


def _chunk(x: _Ctx, idx: torch.Tensor, c: int, limit: int) -> None:
    """Programs ``idx``, each with exactly ``c`` kept K blocks: write their rows of ``out`` and ``skipped``."""
    n, bq, bk, d = idx.numel(), x.block_q, x.block_k, x.qb.shape[-1]
    if n * bq * c * bk > limit and not x.sdpa:
        per = max(1, limit // (bq * c * bk))
        for s in range(0, n, per):
            _chunk(x, idx[s : s + per], c, limit)
        return
    blocks = x.lut.index_select(0, idx)[:, :c]  # [n, c] ascending K-block indices
    tiles = x.kv_base.index_select(0, idx)[:, None] + blocks  # [n, c] rows of kb / vb
    rows = x.i_idx.index_select(0, idx)[:, None] * bq + torch.arange(bq, device=idx.device)  # global rows
    # Element masks: only trailing tiles can hold a column >= lk or (causal) a column above a row.
    needs = (blocks + 1) * bk > x.lk
    if x.is_causal:
        needs |= (blocks + 1) * bk - 1 > rows[:, :1]
    w = int(needs.sum(dim=-1).max())
    q_c = _rows(x.qb, idx)
    lam = x.lam.index_select(0, idx)
    shared = bool((tiles == tiles[:1]).all())  # every program reads the same K/V tiles: no copies
    if shared:
        k_g = _rows(x.kb, tiles[0]).reshape(1, c * bk, d)
        v_g = _rows(x.vb, tiles[0]).reshape(1, c * bk, d)
    else:
        k_g = x.kb.index_select(0, tiles.reshape(-1)).view(n, c * bk, d)
        v_g = x.vb.index_select(0, tiles.reshape(-1)).view(n, c * bk, d)
    # Without element masks (or, for tiles shared by the chunk, only the ragged last K block's padding,
    # which is then cut off), no λ skip means plain attention over the gathered keys.
    trim = c * bk - (bk - x.lk % bk) % bk if shared and not x.is_causal and w == 1 else c * bk
    if x.sdpa and (w == 0 or trim < c * bk) and _no_skip(x, q_c, rows, blocks, tiles, lam):
        # PyTorch's fused CPU flash kernel (4-D inputs); scores in log2 units -> scale ln 2.
        q4 = q_c.reshape(1, 1, n * bq, d) if shared else q_c[:, None]
        o = F.scaled_dot_product_attention(q4, k_g[:, None, :trim], v_g[:, None, :trim], scale=_LN2)
        x.out.index_copy_(0, idx, o.reshape(n, bq, d))
        return
    if n * bq * c * bk > limit and n > 1:  # the explicit route materialises the scores: smaller chunks
        per = max(1, limit // (bq * c * bk))
        for s in range(0, n, per):
            _chunk(x, idx[s : s + per], c, limit)
        return
    s = torch.matmul(q_c, k_g.transpose(1, 2))  # [n, block_q, c*block_k], log2 units
    if w:
        cols = (blocks[:, c - w :, None] * bk + torch.arange(bk, device=idx.device)).reshape(n, 1, w * bk)
        allowed = cols < x.lk
        if x.is_causal:
            allowed = allowed & (cols <= rows[:, :, None])
        s[:, :, (c - w) * bk :].masked_fill_(~allowed, _NEG_INF)
    tile_max = s.view(n, bq, c, bk).amax(dim=-1)  # [n, block_q, c]
    if bool(torch.isfinite(lam).any()):
        # λ skip, decided for every tile at once (see the module docstring).
        prefix = tile_max.cummax(dim=-1).values
        m_old = torch.cat([torch.full_like(prefix[..., :1], _NEG_INF), prefix[..., :-1]], dim=-1)
        diff = torch.where(tile_max == _NEG_INF, _NEG_INF, tile_max - m_old)
        diff.masked_fill_((rows >= x.lq)[..., None], _NEG_INF)  # padded rows do not vote
        skip = diff.amax(dim=1) < -lam[:, None]  # [n, c]
        if bool(skip.any()):
            x.skipped.index_add_(0, idx, skip.sum(dim=-1, dtype=torch.int32))
            s.view(n, bq, c, bk).masked_fill_(skip[:, None, :, None], _NEG_INF)
            tile_max.masked_fill_(skip[:, None, :], _NEG_INF)
    m = tile_max.amax(dim=-1)  # [n, block_q]
    m = torch.where(m == _NEG_INF, 0.0, m)  # rows with no allowed key: every p is 0 below
    p = s.sub_(m[..., None]).exp2_()
    row_sum = p.sum(dim=-1)
    if x.v_dtype != torch.float32:  # P in V's precision, fp32 accumulation (as the loop and the kernel)
        p = p.to(x.v_dtype).float()
    o = torch.matmul(p, v_g)
    o = torch.where(row_sum[..., None] > 0, o / row_sum.clamp_min(1e-30)[..., None], 0.0)
    x.out.index_copy_(0, idx, o)


def _causal_dense_heads(x: _Ctx, count: torch.Tensor, *, B: int, H: int, hkv: int) -> torch.Tensor:
    """Causal heads whose every Q block keeps every causally valid K block, when no λ skip can occur there,
    run as one ``scaled_dot_product_attention(is_causal=True)`` call each; returns ``[P]`` bool: done."""
    bq, bk, nk = x.block_q, x.block_k, x.lut.shape[1]
    n_prog, d = x.qb.shape[0], x.qb.shape[-1]
    nq = n_prog // (B * H)
    done = torch.zeros(n_prog, dtype=torch.bool, device=count.device)
    n_valid = torch.clamp(((x.i_idx + 1) * bq + bk - 1) // bk, max=nk)  # K blocks j with j*bk < (i+1)*bq
    last = x.lut.gather(1, (n_valid - 1)[:, None]).squeeze(1)
    dense = (count == n_valid) & (last == n_valid - 1)  # the LUT is ascending: blocks 0..n_valid-1
    heads = dense.view(B * H, nq).all(dim=1)
    ar = torch.arange(nk, device=count.device)
    for bh in torch.nonzero(heads).flatten().tolist():
        p = slice(bh * nq, (bh + 1) * nq)
        tiles = x.kv_base[p][:, None] + ar
        rows = x.i_idx[p][:, None] * bq + torch.arange(bq, device=count.device)
        valid = ar[None, :] < n_valid[p][:, None]
        if not _no_skip(x, x.qb[p], rows, ar.expand(nq, nk), tiles, x.lam[p], valid):
            continue
        kv0 = int(x.kv_base[bh * nq])
        q_h = x.qb[p].reshape(1, 1, nq * bq, d)[:, :, : x.lq]
        k_h = x.kb[kv0 : kv0 + nk].reshape(1, 1, nk * bk, d)[:, :, : x.lk]
        v_h = x.vb[kv0 : kv0 + nk].reshape(1, 1, nk * bk, d)[:, :, : x.lk]
        o = F.scaled_dot_product_attention(q_h, k_h, v_h, is_causal=True, scale=_LN2)
        x.out[p].view(nq * bq, d)[: x.lq] = o[0, 0]
        done[p] = True
    return done
