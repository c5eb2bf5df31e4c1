"""ToMA: Token Merge with Attention for Diffusion Models — ICML 2025: end-to-end latency of a small diffusers
``UNet2DConditionModel`` (random weights, nothing downloaded) with and without ToMA, paired.

One measured call is one 3-step cycle of denoising-model calls on the same latent: ToMA rebuilds its merge
plan at the first step and reuses it for the next two (``recompute_every=3``, the official
``merge_step_interval``), so the cycle's time is what a generation pays per 3 steps. The baseline is the
same UNet (identical weights, a deep copy) without the patch; calls alternate (``_timing.paired_speedup``),
the ratio is the median per-pair baseline / ToMA (> 1: ToMA is faster). Also printed: the relative L2
difference of ToMA's output from the unpatched one at step 0, and the share of the plain UNet's time that
its self-attention (``attn1``) processors take (the most ToMA can remove).

UNet: 2 down / 2 up blocks, channels (128, 256), 1 layer per block, 8-dim heads (16 and 32 heads),
cross-attention dim 256 over 77 text tokens, float32; latent 32×32 (quick; 1024 tokens in the first
block) and 64×64 (4096 tokens, the SD 1.5 latent at 512 px). ToMA: ratio 0.5 (quick) and 0.75, 16 tiles.

    python packages/generative-models/benchmarks/bench_toma_unet.py [--quick] [--threads 1] [--reps 5] [--json]
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "shared-kernels" / "benchmarks"))
from _timing import Rows, bench_parser, paired_speedup, parse_bench_args

from icml25.generative_models.toma import apply_toma


def small_unet(sample: int) -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=sample,
        in_channels=4,
        out_channels=4,
        block_out_channels=(128, 256),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=256,
        attention_head_dim=8,
        norm_num_groups=32,
    ).eval()


def attn1_share(unet: torch.nn.Module, x, t, enc) -> float:
    """Fraction of one plain UNet call spent in the self-attention processors (timed by wrapping them)."""
    spent = [0.0]

    class Timed:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, *a, **k):
            t0 = time.perf_counter()
            out = self.inner(*a, **k)
            spent[0] += time.perf_counter() - t0
            return out

    blocks = [m for n, m in unet.named_modules() if n.endswith("attn1")]
    originals = [b.processor for b in blocks]
    for b in blocks:
        b.set_processor(Timed(b.processor))
    unet(x, t, encoder_hidden_states=enc)
    spent[0] = 0.0
    t0 = time.perf_counter()
    unet(x, t, encoder_hidden_states=enc)
    total = time.perf_counter() - t0
    for b, p in zip(blocks, originals):
        b.set_processor(p)
    return spent[0] / total


def main(argv: list[str] | None = None) -> None:
    args = parse_bench_args(bench_parser(__doc__), argv)
    rows = Rows("toma_unet", args)
    sizes = [32] if args.quick else [32, 64]
    ratios = (0.5,) if args.quick else (0.5, 0.75)
    torch.set_grad_enabled(False)
    print(
        f"UNet2DConditionModel (128, 256) random weights, float32, threads={torch.get_num_threads()} pairs={args.reps}"
    )
    print(
        f"{'latent':>7} {'tokens':>6} {'attn1':>6} {'ratio':>5} | {'plain ms/3 steps':>16} {'ToMA ms':>9} {'speedup':>7} {'rel diff':>8}"
    )
    for side in sizes:
        plain = small_unet(side)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 4, side, side, generator=g)
        enc = torch.randn(1, 77, 256, generator=g)
        t = torch.tensor([500])
        ref = plain(x, t, encoder_hidden_states=enc).sample
        share = attn1_share(plain, x, t, enc)
        for ratio in ratios:
            toma = copy.deepcopy(plain)
            state = apply_toma(toma, ratio=ratio, num_tiles=16, recompute_every=3)
            out = toma(x, t, encoder_hidden_states=enc).sample
            diff = float((out - ref).norm() / ref.norm())

            def cycle_toma(toma=toma, state=state, x=x, t=t, enc=enc):
                state.reset()
                toma._toma_calls = 0
                for _ in range(3):
                    toma(x, t, encoder_hidden_states=enc)

            def cycle_plain(plain=plain, x=x, t=t, enc=enc):
                for _ in range(3):
                    plain(x, t, encoder_hidden_states=enc)

            t_m, t_b, r = paired_speedup(cycle_toma, cycle_plain, args.reps, cuda=False)
            print(
                f"{side:>4}x{side:<2} {side * side:>6} {share:>6.2f} {ratio:>5.2f} | {t_b * 1e3:>16.1f} {t_m * 1e3:>9.1f} "
                f"{r:>6.2f}x {diff:>8.3f}",
                flush=True,
            )
            rows.add(
                f"latent {side}x{side} ({side * side} tokens), ToMA ratio {ratio}, 16 tiles", "UNet + ToMA",
                "same UNet, unpatched", t_m, t_b, r,
                "end-to-end UNet2DConditionModel latency per 3 denoising calls (1 plan rebuild + 2 reuses)",
                attn1_share=share, rel_diff=diff,
            )  # fmt: skip


if __name__ == "__main__":
    main()
