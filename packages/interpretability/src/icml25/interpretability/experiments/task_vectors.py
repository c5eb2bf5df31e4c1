"""Vision-Language Models Create Cross-Modal Task Representations — ICML 2025, P00: small-scale reproduction.

Luo, Darrell, Bar, ICML 2025 (arXiv 2410.22330; official code ``g-luo/task_vectors_are_cross_modal``).
Claim: the hidden state at the final delimiter of a task prompt is a task vector shared across modalities:
extracted from text examples and patched (by replacement, at one middle layer, prompt pass only) into
zero-shot *image* queries, it makes the model perform the task about as well as a vector from image examples,
and instruction-derived vectors work too.

Our CPU-scale setting (:class:`Setting` gives each knob's paper value next to ours): a two-modality toy
(:class:`~icml25.interpretability.task_vectors_toy.ToyVLM`: a random-init ``transformers.LlamaForCausalLM`` whose
"images" are scikit-learn 8x8 digits entering through a learned linear projection as ``inputs_embeds``)
trained from scratch on text-only ICL, image-only ICL and instruction prompts (never text demos with an image
query) for the tasks successor / double / parity / complement of the digit ``k``, each with its own output
tokens. A summary token ``S`` follows the demonstrations and a 4-D attention mask lets the query see only
``BOS``, ``S`` and itself, so ``S`` is the task channel by construction (without it the toy gathers the
task directly from the demos and holds no patchable vector: the full run reports that free-attention toy); whether text-demo and image-demo summaries are
*interchangeable* stays emergent, and that is the claim tested. Vectors are means over validation prompts,
read at ``S`` from every decoder layer; the layer is the best text->image layer on validation queries
(held-out digits), and every number is test accuracy at that layer.

Measured: (a) no context, (b) cross-modal prompt (text demos, image query; ungated), (c) text->image patch,
(d) image->image patch, (e) instruction->image patch, the (ICL + instruction)/2 ensemble, (f) override: an
image-ICL prompt of task A with task B's text vector patched at ``S``, the fraction answering f_B
(report-only), (g1) a norm-matched random direction (same norm as the task's text vector, 5 draws, same layer
and position; the mean of all tasks' vectors is reported too, ungated: with nearly orthogonal task codes that
mean is itself task-like), (g2) task B's vector in task-A queries, and the cosine of the mean vectors (same
task / other modality vs other task / same modality).

Pass rule (:func:`checks`, thresholds fixed before the runs): full: (c) >= 0.6, (c) >= 0.75 (d), (c) >= (a) +
0.35, (e) >= (a) + 0.2, (g1) random direction <= (a) + 0.1 on every task (mean over draws), (g2) f_A <= (a) + 0.1 and f_B >= 0.5, and the cosine
ordering at the chosen layer; quick (3 layers, d 32, 2 tasks): (c) >= (a) + 0.25 and (g2).

Run: ``python -m icml25.interpretability.experiments.task_vectors [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from icml25.interpretability.task_vectors import ensemble, extract_task_vectors, layer_sweep, patched_accuracy
from icml25.interpretability.task_vectors_toy import TOY_TASKS, ToyTaskData, ToyVLM, train_toy_vlm
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

PAPER = "P00"
CLAIM = (
    "A task vector read at the final delimiter of text examples, patched into zero-shot image queries at a "
    "middle layer, makes the model perform the task about as well as a vector from image examples, far above "
    "no context; instruction-derived vectors work too."
)
BROKEN = ("position",)


@dataclass(frozen=True)
class Setting:
    """One reproduction scale: toy model, training budget and evaluation sizes."""

    n_layers: int
    """Decoder layers (paper: Idefics2-8B / LLaVA-1.5-7B, 32 layers; planned 4; ours 4, quick 3)."""
    d_model: int
    """Hidden size (paper 4096; planned 128; ours 128, quick 32)."""
    n_tasks: int
    """Tasks (paper 6 text/image task pairs; planned 4: successor, double, parity, complement; quick 2)."""
    steps: int
    """AdamW steps (planned 1,200 at batch 64; ours 600, quick 150 at batch 32: CPU budget)."""
    batch_size: int
    """Prompts per step (planned 64; ours 64, quick 32)."""
    lr: float = 3e-3
    """AdamW learning rate (planned 1e-3; ours 3e-3: fewer steps)."""
    n_heads: int = 4
    """Attention heads (planned 4, as here)."""
    n_shots: int = 5
    """Demonstrations per prompt (paper N = 5, as here)."""
    n_vec: int = 200
    """Validation prompts averaged into one task vector (paper: the validation split; ours 200, quick 64)."""
    n_eval: int = 200
    """Zero-shot queries per task and split (ours 200, quick 100)."""
    n_random: int = 5
    """Norm-matched random directions per task for the (g1) control (planned 5, as here; quick too)."""
    free_attention: bool = True
    """Also train the toy without the bottleneck and report its patching at the final delimiter (no gate;
    planned as a report; quick: skipped)."""


FULL = Setting(n_layers=4, d_model=128, n_tasks=4, steps=600, batch_size=64)
QUICK = Setting(
    n_layers=3, d_model=32, n_tasks=2, steps=150, batch_size=32, n_vec=64, n_eval=100, free_attention=False
)

MIN_PATCH = 0.6
MIN_CROSS_RATIO = 0.75
FULL_MARGIN = 0.35
QUICK_MARGIN = 0.25
INSTR_MARGIN = 0.2
CONTROL_SLACK = 0.1
MIN_OVERRIDE = 0.5


def checks(setting: Setting) -> list[Check]:
    """The pass rule (see the module docstring)."""
    g2 = [
        Check(
            f"(g2) task B's vector in task-A queries: f_A <= (a) + {CONTROL_SLACK:g}",
            lambda m: m["g2_f_a"] <= m["no_context"] + CONTROL_SLACK + 1e-9,
        ),
        Check(f"(g2) ... and f_B >= {MIN_OVERRIDE:g}", lambda m: m["g2_f_b"] >= MIN_OVERRIDE),
    ]
    if setting == QUICK:
        return [
            Check(
                f"(c) text->image patch >= (a) no context + {QUICK_MARGIN:g}",
                lambda m: m["text_patch"] >= m["no_context"] + QUICK_MARGIN - 1e-9,
            ),
            *g2,
        ]
    return [
        Check(f"(c) text->image patch >= {MIN_PATCH:g}", lambda m: m["text_patch"] >= MIN_PATCH),
        Check(
            f"(c) >= {MIN_CROSS_RATIO:g} x (d) image->image patch",
            lambda m: m["text_patch"] >= MIN_CROSS_RATIO * m["image_patch"] - 1e-9,
        ),
        Check(
            f"(c) >= (a) no context + {FULL_MARGIN:g}",
            lambda m: m["text_patch"] >= m["no_context"] + FULL_MARGIN - 1e-9,
        ),
        Check(
            f"(e) instruction->image patch >= (a) + {INSTR_MARGIN:g}",
            lambda m: m["instruction_patch"] >= m["no_context"] + INSTR_MARGIN - 1e-9,
        ),
        Check(
            f"(g1) norm-matched random direction <= (a) + {CONTROL_SLACK:g} on every task (mean over draws)",
            lambda m: m["g1_max_excess"] <= CONTROL_SLACK + 1e-9,
        ),
        *g2,
        Check(
            "cosine(same task, other modality) > cosine(other task, same modality) at the chosen layer",
            lambda m: m["cos_same_task"] > m["cos_same_modality"],
        ),
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it (the results ledger records the full one)."""
    return threshold_text(checks(QUICK if quick else FULL))


# ----------------------------------------------------------------------------------------- measurement
def _mean_cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a, b, dim=-1).mean())


def cosines(text: dict[int, torch.Tensor], image: dict[int, torch.Tensor], layer: int) -> tuple[float, float]:
    """Mean cosine of the task-mean vectors at ``layer``: (same task, other modality), (other task, same
    modality)."""
    tasks = list(text)
    same_task = np.mean([_mean_cos(text[t][layer], image[t][layer]) for t in tasks])
    other = [
        _mean_cos(v[t][layer], v[u][layer])
        for v in (text, image)
        for t, u in itertools.permutations(tasks, 2)
    ]
    return float(same_task), float(np.mean(other))


@functools.lru_cache(maxsize=2)
def train_toy(
    setting: Setting, seed: int, bottleneck: bool = True
) -> tuple[ToyVLM, ToyTaskData, tuple[float, ...]]:
    """The toy VLM trained on its data (cached, so that the broken variant reuses the weights: a model is
    never modified after training); ``bottleneck=False``: the free-attention toy."""
    data = ToyTaskData(list(range(setting.n_tasks)), setting.n_shots, seed=seed, bottleneck=bottleneck)
    model = ToyVLM(setting.n_layers, setting.d_model, setting.n_heads, seed=seed)
    bar = progress(total=setting.steps, desc=f"P00 toy VLM seed={seed} bottleneck={bottleneck}")
    losses = train_toy_vlm(
        model, data, setting.steps, setting.batch_size, setting.lr, seed=seed + 1000,
        callback=lambda _s, _l: bar.update(1),
    )  # fmt: skip
    bar.close()
    return model, data, tuple(losses)


def evaluate(
    setting: Setting, seed: int = 0, broken: str | None = None, out_dir: str | Path | None = None
) -> Report:
    """Train the toy, extract the vectors, choose the layer on validation and measure (a)-(g) on test.
    ``broken="position"`` patches the query's final ``->`` instead of ``S`` (a wrong source/target
    position: the broken variant of the tests)."""
    if broken is not None and broken not in BROKEN:
        raise ValueError(f"broken must be None or one of {BROKEN}, got {broken!r}")
    t0, c0 = time.perf_counter(), time.process_time()
    tasks = list(range(setting.n_tasks))
    model, data, losses = train_toy(setting, seed)
    g = torch.Generator().manual_seed(seed + 2000)
    n, L = setting.n_eval, setting.n_layers
    src = {
        "text": {t: extract_task_vectors(model, data.icl(t, setting.n_vec, "text", source=True, generator=g)) for t in tasks},
        "image": {t: extract_task_vectors(model, data.icl(t, setting.n_vec, "image", source=True, generator=g)) for t in tasks},
        "instruction": {t: extract_task_vectors(model, data.instruction(t, 1, source=True, generator=g)) for t in tasks},
    }  # fmt: skip
    val = {t: data.zero_shot(t, n, "image", "val", generator=g) for t in tasks}
    test = {t: data.zero_shot(t, n, "image", "test", generator=g) for t in tasks}
    if broken == "position":  # the query's final "->" instead of S
        for q in (*val.values(), *test.values()):
            q["position"] = torch.full_like(q["position"], q["input_ids"].shape[1] - 1)

    def sweep(kind: str, queries: dict[int, dict[str, torch.Tensor]]) -> dict[int, float]:
        per = [layer_sweep(model, src[kind][t], queries[t]) for t in tasks]
        return {layer: float(np.mean([p[layer] for p in per])) for layer in range(L)}

    val_curve = sweep("text", val)
    layer = max(val_curve, key=lambda k: (val_curve[k], -k))

    def acc(vectors: dict[int, torch.Tensor], queries: dict[int, dict[str, torch.Tensor]]) -> float:
        return float(np.mean([patched_accuracy(model, vectors[t][layer], layer, queries[t]) for t in tasks]))

    no_ctx = {t: patched_accuracy(model, None, 0, test[t]) for t in tasks}
    m: dict[str, float] = {"no_context": float(np.mean(list(no_ctx.values())))}
    m["cross_modal_prompt"] = float(
        np.mean([patched_accuracy(model, None, 0, data.icl(t, n, "text", "test", query_modality="image", generator=g)) for t in tasks])
    )  # fmt: skip
    m["same_modality_prompt"] = float(
        np.mean(
            [patched_accuracy(model, None, 0, data.icl(t, n, "image", "test", generator=g)) for t in tasks]
        )
    )
    m["text_patch"] = acc(src["text"], test)
    m["image_patch"] = acc(src["image"], test)
    m["instruction_patch"] = acc(src["instruction"], test)
    m["ensemble_patch"] = acc({t: ensemble(src["text"][t], src["instruction"][t]) for t in tasks}, test)
    other = {t: tasks[(i + 1) % len(tasks)] for i, t in enumerate(tasks)}
    # (f) override: image-ICL prompts of task A, task B's text vector patched at S
    override = []
    for t in tasks:
        p = data.icl(t, n, "image", "test", generator=g)
        if broken == "position":
            p["position"] = torch.full_like(p["position"], p["input_ids"].shape[1] - 1)
        p_b = dict(p, labels=data.relabel(p, other[t]))
        override.append(patched_accuracy(model, src["text"][other[t]][layer], layer, p_b))
    m["override_f_b"] = float(np.mean(override))
    # (g1) random directions with the norm of the task's text vector, same layer and position (mean over
    # draws, per task); the mean of all tasks' vectors is reported, not gated; (g2) task B's vector in task-A
    g_rand = torch.Generator().manual_seed(seed + 4000)
    g1 = {
        t: random_direction_accuracy(model, src["text"][t][layer], layer, test[t], setting.n_random, g_rand)
        for t in tasks
    }
    m["g1_random_direction"] = float(np.mean(list(g1.values())))
    m["g1_max_excess"] = float(max(g1[t] - no_ctx[t] for t in tasks))
    mean_vec = torch.stack([src["text"][t] for t in tasks]).mean(0)
    mean_acc = {t: patched_accuracy(model, mean_vec[layer], layer, test[t]) for t in tasks}
    m["mean_vector"] = float(np.mean(list(mean_acc.values())))
    m["mean_vector_max_excess"] = float(max(mean_acc[t] - no_ctx[t] for t in tasks))
    for t in tasks:
        name = TOY_TASKS[t].name
        m[f"g1_random_{name}"], m[f"mean_vector_{name}"] = g1[t], mean_acc[t]
        m[f"no_context_{name}"] = no_ctx[t]
    m["g2_f_a"] = float(
        np.mean([patched_accuracy(model, src["text"][other[t]][layer], layer, test[t]) for t in tasks])
    )
    m["g2_f_b"] = float(
        np.mean([patched_accuracy(model, src["text"][other[t]][layer], layer, dict(test[t], labels=data.relabel(test[t], other[t]))) for t in tasks])
    )  # fmt: skip
    m["cos_same_task"], m["cos_same_modality"] = cosines(src["text"], src["image"], layer)
    m["cos_same_task_layer0"], m["cos_same_modality_layer0"] = cosines(src["text"], src["image"], 0)
    m["layer"] = float(layer)
    if setting.free_attention and broken is None:
        m.update(free_attention_report(setting, seed))
    for k, v in val_curve.items():
        m[f"val_text_patch_l{k}"] = v
    m["final_loss"] = float(np.mean(losses[-20:]))
    m["wall_seconds"] = time.perf_counter() - t0
    m["cpu_seconds"] = time.process_time() - c0
    figures = []
    if out_dir is not None:
        curves = {kind: sweep(kind, test) for kind in ("text", "image", "instruction")}
        figures.append(plot(out_dir, curves, m, layer))
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=m,
        headline="text_patch",
        better="higher",  # accuracy of the image task with the text task vector patched in
        baseline="no_context",
        figures=figures,
        seeds=[seed],
        notes=(
            f"ToyVLM: LlamaForCausalLM {setting.n_layers} layers, d {setting.d_model}, {setting.n_heads} heads; "
            f"digits images via a learned 64->d projection; tasks {[TOY_TASKS[t].name for t in tasks]}; "
            f"{setting.steps} AdamW steps at lr {setting.lr:g}, batch {setting.batch_size}; {setting.n_shots} shots; "
            f"summary-token bottleneck; vectors: means over {setting.n_vec} validation prompts; layer chosen on "
            f"{n} validation image queries per task ({layer}); test on {n} held-out-digit queries per task."
            + (f" BROKEN variant: {broken}." if broken else "")
        ),
    )


def random_direction_accuracy(
    model: ToyVLM,
    vector: torch.Tensor,
    layer: int,
    queries: dict[str, torch.Tensor],
    n_draws: int,
    generator: torch.Generator,
) -> float:
    """Mean accuracy on ``queries`` over ``n_draws`` random directions (isotropic Gaussian, normalised) scaled to
    ``vector``'s norm and patched at ``layer`` and the queries' positions: the (g1) control."""
    norm = vector.norm()
    accs = []
    for _ in range(n_draws):
        r = torch.randn(vector.shape, generator=generator, dtype=vector.dtype)
        accs.append(patched_accuracy(model, r * (norm / r.norm()), layer, queries))
    return float(np.mean(accs))


def free_attention_report(setting: Setting, seed: int) -> dict[str, float]:
    """The toy trained without the bottleneck (the query sees the demonstrations): vectors read at the final
    ``->`` of full ICL prompts (the paper's position; the last example acts as the query), patched at the
    final ``->`` of zero-shot image queries; layer chosen on validation. Reported, not gated."""
    model, data, _ = train_toy(setting, seed, bottleneck=False)
    g = torch.Generator().manual_seed(seed + 3000)
    tasks, n = list(range(setting.n_tasks)), setting.n_eval
    vec = {
        kind: {t: extract_task_vectors(model, data.icl(t, setting.n_vec, kind, generator=g), position=-1) for t in tasks}
        for kind in ("text", "image")
    }  # fmt: skip
    val = {t: data.zero_shot(t, n, "image", "val", generator=g) for t in tasks}
    test = {t: data.zero_shot(t, n, "image", "test", generator=g) for t in tasks}

    def sweep(kind: str, queries: dict[int, dict[str, torch.Tensor]]) -> dict[int, float]:
        per = [layer_sweep(model, vec[kind][t], queries[t], position=-1) for t in tasks]
        return {layer: float(np.mean([p[layer] for p in per])) for layer in range(setting.n_layers)}

    val_curve = sweep("text", val)
    layer = max(val_curve, key=lambda k: (val_curve[k], -k))
    return {
        "free_no_context": float(np.mean([patched_accuracy(model, None, 0, test[t]) for t in tasks])),
        "free_cross_modal_prompt": float(
            np.mean(
                [
                    patched_accuracy(
                        model, None, 0, data.icl(t, n, "text", "test", query_modality="image", generator=g)
                    )
                    for t in tasks
                ]
            )
        ),
        "free_text_patch": sweep("text", test)[layer],
        "free_image_patch": sweep("image", test)[layer],
        "free_layer": float(layer),
    }


def plot(out_dir: str | Path, curves: dict[str, dict[int, float]], m: dict[str, float], layer: int) -> Path:
    """Test accuracy of the patched image queries per layer, by source of the vector, with the baselines."""
    fig, ax = new_figure(figsize=(6.5, 4))
    for kind, label in (
        ("text", "(c) text demos"),
        ("image", "(d) image demos"),
        ("instruction", "(e) instruction"),
    ):
        xs = sorted(curves[kind])
        ax.plot(xs, [curves[kind][x] for x in xs], marker="o", label=label)
    ax.axhline(m["no_context"], color="grey", ls="--", label="(a) no context")
    ax.axhline(m["cross_modal_prompt"], color="black", ls=":", label="(b) text demos in context")
    ax.axvline(layer, color="red", alpha=0.3, label="layer chosen on validation")
    ax.set_xticks(sorted(curves["text"]))
    ax.set_xlabel("patched layer (output of decoder block)")
    ax.set_ylabel("image-query accuracy (test)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("P00 cross-modal task vectors on the toy VLM")
    return save_figure(fig, out_dir, "p00_task_vectors")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the cross-modal task-vector claim at small scale (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1):  # tiny models: one thread is fastest on 2 cores and bit-identical across machines
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
