"""The Illusion of Role Separation: Hidden Shortcuts in LLM Role Learning (and How to Fix Them) — ICML 2025, P44: small-scale reproduction.

Wang, Jiang, Yu, Huang, ICML 2025 (arXiv 2505.00626; no official code). Claim: a model fine-tuned to
follow the system instruction and treat user text as data latches onto the instruction's proximity to
the begin-of-text token; position-enhanced fine-tuning (PFT: a gap ``d`` in the position ids between
the system block and the rest) gives an invariant role cue and generalises when the instruction moves
away from BOS, without losing in-distribution accuracy.

Our CPU-scale setting (:class:`Setting` gives each knob's paper value next to ours): a random-init
``transformers.LlamaForCausalLM`` (RoPE) trained from scratch on
:class:`~icml25.interpretability.role_separation.RoleTask` with SYS/USR delimiters: a system block of
1-24 tokens whose op sits at system index <= 2 (proximity correlated with the role), a user block of
6-10 content tokens with an injected op (p = 0.5); the target is the system op applied to the user
content (``answer="sequence"``: the model must find the instruction and carry it out, the injected op
ignored). Arms: (A) standard position ids, (B) PFT with d = 128, (C, recorded) augmentation with the op
at system index 0-12. Evaluation: exact-match accuracy of the whole answer in distribution (ID) and on
the proximity probe (OOD: the op at system index >= 8, the injection always present; every length and
distance was seen in training).

Pass rule (:func:`checks`, the thresholds fixed before the runs): ID >= 0.85 for (A) and (B); (B) OOD
>= 0.8; (B) OOD >= (A) OOD + 0.10; (B) ID - OOD <= 0.05; and the PFT ids of the collator and of the
decode loop agree (jump of exactly 1 + d at the system/user boundary, new tokens at last + 1, ...).
Full: the planned setting (hidden 128, 3 layers, 1,200 AdamW steps at lr 1e-3, batch 64), the means over
3 seeds. Quick (the plan's second review: "pft_position_ids and decode-loop tests plus loss decrease, no
accuracy thresholds"): 1 seed of a smaller model trained for 80 steps on the role decision alone
(``answer="op"``), gated on the mechanics only: the training loss decreases in (A) and (B), and arm (B)'s ids
jump by exactly 1 + d at the boundary in the collator and the decode loop. The four accuracies are reported,
not gated: over three stops about 20 quick settings were measured and in every one some seed of 0-4 gives
PFT no OOD advantage (80 steps teach the role decision, not which cue to use).

Run: ``python -m icml25.interpretability.experiments.role_separation [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from icml25.interpretability.role_separation import (
    RoleTask,
    pft_generate,
    pft_llama,
    role_probe,
    shortcut_suite,
    train_role_model,
)
from icml25.kernels.experiment import (
    Check,
    Report,
    experiment_main,
    new_figure,
    progress,
    save_figure,
    seed_everything,
    threshold_text,
    torch_threads,
)

PAPER = "P44"
CLAIM = (
    "Vanilla position ids let a role-trained model rely on the instruction's proximity to BOS; PFT (a gap d "
    "in the position ids between the system block and the rest) generalises when the instruction moves "
    "away from BOS and keeps in-distribution accuracy."
)
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    """One reproduction scale: model, training budget, task and seeds."""

    hidden: int
    """Hidden size (paper: Llama-3 / Gemma instruct models, unverified; planned 128, as full; quick 32)."""
    n_layers: int
    """Decoder layers (planned 3, as full; quick 2)."""
    steps: int
    """AdamW steps per arm (planned: 1,200, as full; quick 80)."""
    n_seeds: int
    """Seeds averaged (planned 3, as full; quick 1)."""
    gap: int = 128
    """PFT gap d (paper: unverified; planned 128, as here)."""
    batch_size: int = 64
    """Conversations per step (planned 64, as full; quick 32)."""
    lr: float = 1e-3
    """AdamW learning rate (planned 1e-3, as full; quick 3e-3: few steps)."""
    n_eval: int = 512
    """Evaluation conversations per split (full 512, quick 128)."""
    answer: str = "sequence"
    """RoleTask answer (planned and full: the system op applied to the user content; quick: the op token)."""
    augment_arm: bool = True
    """Train and record (C) augmentation with op positions 0-12 (full; quick skips it)."""
    accuracy_gate: bool = True
    """Gate on the accuracy checks (full); quick gates on the mechanics only (loss decrease, PFT ids)."""


FULL = Setting(hidden=128, n_layers=3, steps=1200, n_seeds=3)
QUICK = Setting(
    hidden=32,
    n_layers=2,
    steps=80,
    n_seeds=1,
    batch_size=32,
    lr=3e-3,
    n_eval=128,
    answer="op",
    augment_arm=False,
    accuracy_gate=False,
)

MIN_ID = 0.85
MIN_PFT_OOD = 0.80
OOD_MARGIN = 0.10
MAX_PFT_DROP = 0.05


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (see the module docstring)."""
    ids = Check(
        f"PFT ids of arm (B): a jump of exactly 1 + d = {1 + setting.gap} at the boundary, consistent in the "
        "collator and the decode loop",
        lambda m: m["ids_consistent"] == 1.0,
    )
    if not setting.accuracy_gate:
        return [Check("training loss decreases in (A) and (B)", lambda m: m["loss_decrease_min"] > 0), ids]
    return [
        Check(f"ID accuracy (A) >= {MIN_ID:g}", lambda m: m["baseline_id"] >= MIN_ID),
        Check(f"ID accuracy (B) >= {MIN_ID:g}", lambda m: m["pft_id"] >= MIN_ID),
        Check(f"OOD accuracy (B) >= {MIN_PFT_OOD:g}", lambda m: m["pft_ood"] >= MIN_PFT_OOD),
        Check(
            f"OOD accuracy (B) >= OOD accuracy (A) + {OOD_MARGIN:g}",
            lambda m: m["pft_ood"] >= m["baseline_ood"] + OOD_MARGIN - 1e-9,
        ),
        Check(
            f"(B) ID - OOD <= {MAX_PFT_DROP:g}", lambda m: m["pft_id"] - m["pft_ood"] <= MAX_PFT_DROP + 1e-9
        ),
        ids,
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


# ----------------------------------------------------------------------------------------- measurement
def ids_consistent(
    model: torch.nn.Module, task: RoleTask, gap: int, seed: int, expected_gap: int | None = None
) -> bool:
    """The collator's ids (built with ``gap``) jump by exactly ``1 + expected_gap`` (default ``gap``) at the
    system/user boundary and are ``+1`` elsewhere, and :func:`pft_generate` continues them with ``last + 1,
    last + 2, ...``."""
    b = task.batch(4, gap, seed=seed)
    expected_gap = gap if expected_gap is None else expected_gap
    ok = True
    for row in range(4):
        real = b["attention_mask"][row].bool()
        pos, roles = b["position_ids"][row, real], b["role_ids"][row, real]
        diffs = pos[1:] - pos[:-1]
        boundary = (roles[1:] != 0) & (roles[:-1] == 0)
        ok &= bool((diffs[boundary] == 1 + expected_gap).all()) and bool((diffs[~boundary] == 1).all())
        # prompt = everything up to and including ASST (the first assistant token)
        n_prompt = int((roles != 2).sum()) + 1
        out = pft_generate(model, b["input_ids"][row : row + 1, :n_prompt], pos[None, :n_prompt], 3)
        ok &= out.position_ids[0, n_prompt:].tolist() == [int(pos[n_prompt - 1]) + k for k in (1, 2, 3)]
    return ok


@functools.lru_cache(maxsize=4)
def train_arm(setting: Setting, task: RoleTask, gap: int, seed: int) -> tuple[torch.nn.Module, list[float]]:
    """A fresh model trained on ``task`` with PFT ids of ``gap`` (``0``: standard ids); cached, so that a
    broken variant (arm (B) with gap 0) reuses arm (A)'s weights (a model is never modified after training)."""
    model = pft_llama(task.vocab_size, setting.hidden, setting.n_layers, 4, seed=seed)
    bar = progress(total=setting.steps, desc=f"P44 gap={gap} seed={seed}")
    losses = train_role_model(
        model, task, gap, setting.steps, setting.batch_size, setting.lr, seed=seed + 1000,
        callback=lambda _s, _l: bar.update(1),
    )  # fmt: skip
    bar.close()
    return model, losses


def evaluate(
    setting: Setting, seed: int = 0, pft_gap: int | None = None, out_dir: str | Path | None = None
) -> Report:
    """Train the arms for every seed and apply :func:`checks` to the seed means. ``pft_gap`` overrides the
    gap of arm (B) (``0``: the mechanism removed, the broken variant of the tests; its ids are still checked
    against the setting's gap)."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    gap = setting.gap if pft_gap is None else pft_gap
    task = RoleTask(answer=setting.answer)
    aug = RoleTask(answer=setting.answer, op_index=(0, 12))
    arms = {"baseline": (task, 0), "pft": (task, gap)}
    if setting.augment_arm:
        arms["augment"] = (aug, 0)
    per: dict[str, list[dict[str, float]]] = {k: [] for k in arms}
    curves: dict[str, list[float]] = {}
    consistent, probes = True, {}
    for s in range(seed, seed + setting.n_seeds):
        for name, (train_task, g) in arms.items():
            model, losses = train_arm(setting, train_task, g, s)
            splits = ("id", "proximity", "task_type") if setting.augment_arm else ("id", "proximity")
            per[name].append(shortcut_suite(model, task, g, n=setting.n_eval, seed=s + 2000, splits=splits))
            logger.info("P44 seed %d arm %s: %s, final loss %.4g", s, name, per[name][-1], losses[-1])
            if s == seed:
                curves[name] = losses
                probe_batch = task.batch(64, g, seed=s + 3000)
                probes[name] = role_probe(model, probe_batch, layer=1)
                if name == "pft":
                    consistent &= ids_consistent(model, task, g, s, expected_gap=setting.gap)
    mean = {k: {m: float(np.mean([d[m] for d in v])) for m in v[0]} for k, v in per.items()}
    metrics = {
        "baseline_id": mean["baseline"]["id"],
        "baseline_ood": mean["baseline"]["proximity"],
        "pft_id": mean["pft"]["id"],
        "pft_ood": mean["pft"]["proximity"],
        "baseline_role_probe_l1": probes["baseline"],
        "pft_role_probe_l1": probes["pft"],
        "baseline_final_loss": float(np.mean(curves["baseline"][-10:])),
        "pft_final_loss": float(np.mean(curves["pft"][-10:])),
        "ids_consistent": float(consistent),
        "loss_decrease_min": float(
            min(np.mean(curves[n][:10]) - np.mean(curves[n][-10:]) for n in ("baseline", "pft"))
        ),
        "gap": float(gap),
        "n_seeds": float(setting.n_seeds),
    }
    for name in ("baseline", "pft"):
        metrics[f"{name}_ood_min_seed"] = float(min(d["proximity"] for d in per[name]))
    if "task_type" in mean["pft"]:
        metrics["baseline_task_type"] = mean["baseline"]["task_type"]
        metrics["pft_task_type"] = mean["pft"]["task_type"]
    if "augment" in mean:
        metrics["augment_id"] = mean["augment"]["id"]
        metrics["augment_ood"] = mean["augment"]["proximity"]
    metrics["wall_seconds"] = time.perf_counter() - t0
    metrics["cpu_seconds"] = time.process_time() - c0
    figures = [plot(out_dir, mean, curves)] if out_dir is not None else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="pft_ood",
        baseline="baseline_ood",
        better="higher",  # exact-match accuracy of PFT on the proximity probe (instruction far from BOS)
        figures=figures,
        seeds=list(range(seed, seed + setting.n_seeds)),
        notes=(
            f"LlamaForCausalLM hidden {setting.hidden}, {setting.n_layers} layers, 4 heads, RoPE theta 1e4, "
            f"{setting.steps} AdamW steps at lr {setting.lr:g}, batch {setting.batch_size}, {setting.n_seeds} "
            f"seed(s), PFT gap {gap}; RoleTask with SYS/USR delimiters, answer={setting.answer!r}; train op at "
            "system index <= 2, OOD op at system index >= 8 with the injection always present; "
            f"{setting.n_eval} evaluation conversations per split."
        ),
    )


def plot(out_dir: str | Path, mean: dict[str, dict[str, float]], curves: dict[str, list[float]]) -> Path:
    """ID vs proximity-probe accuracy per arm, and the training curves."""
    fig, (ax, ax2) = new_figure(1, 2, figsize=(10, 4))
    names = list(mean)
    x = np.arange(len(names))
    ax.bar(x - 0.2, [mean[n]["id"] for n in names], 0.4, label="ID")
    ax.bar(x + 0.2, [mean[n]["proximity"] for n in names], 0.4, label="OOD (op far from BOS)")
    ax.set_xticks(
        x, [{"baseline": "(A) standard", "pft": "(B) PFT", "augment": "(C) augment"}[n] for n in names]
    )
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("exact-match accuracy")
    ax.legend(loc="lower right")
    for n, c in curves.items():
        ax2.plot(c, label=n)
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_ylabel("answer cross-entropy")
    ax2.legend()
    fig.suptitle("P44 role separation: standard ids vs PFT")
    fig.tight_layout()
    return save_figure(fig, out_dir, "p44_role_separation")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the PFT claim at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1):  # tiny models: one thread is fastest on 2 cores and bit-identical across machines
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
