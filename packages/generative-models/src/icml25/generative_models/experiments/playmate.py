"""Playmate: Flexible Control of Portrait Animation via 3D-Implicit Space Guided Diffusion — ICML 2025, P41: reproduction.
Small-scale reproduction in the motion space (no pixels).

Ma et al., ICML 2025 (arXiv 2502.07203; ``Playmate111/Playmate`` releases no code). Claim: a flow-matching
diffusion transformer that generates facial motion in a 3D-implicit keypoint space, with per-attribute
(decoupled) normalisation of expression and pose, follows the audio (lip sync) while pose can be replaced by
a driving sequence, and a zero-initialised emotion branch trained on the frozen stage-1 model adds emotion
control. FID/FVD/Sync-C need real video and a pretrained renderer; only the motion-space mechanisms are
testable here.

Setting (:class:`Setting`): :class:`~icml25.generative_models.playmate_toy.SyntheticTalkingFaces`, 20 keypoints
at realistic raw scales (expression offsets ≈ 0.01, rotation in degrees std ≈ 10, translation ≈ 0.1, scale
≈ 1); 16-dim audio features mixing the energy envelope (which drives mouth opening) with nuisance signals;
4 emotions as constant brow/mouth-corner offsets; head pose a random walk independent of audio; 40
identities (canonical keypoints = the reference). Stage 1: :class:`~icml25.generative_models.playmate.
AudioToMotionDiT` (flow matching, audio CFG 2, previous-clip prefix); stage 2: an
:class:`~icml25.generative_models.playmate.EmotionControlBranch` on the frozen stage 1 (emotion CFG 2).

Metrics on held-out sequences: lip-sync = mean per-sequence Pearson correlation between the generated
mouth opening and the audio envelope; the same with the audio of another sequence (shuffled); with a driving
pose imposed (pose error to the driver, lip-sync change); the same network and steps on jointly scaled codes
(``mode="global"``, the un-normalised ablation); emotion accuracy of a logistic-regression classifier trained
on ground-truth expression codes, for stage 2 with the requested label and for stage 1 (which cannot see it).

Pass rule (:func:`checks`), fixed before running from the reproduction plan and its second review: full:
lip-sync ≥ 0.8; shuffled ≤ 0.2; imposed-pose error ≤ 1e-5 and lip-sync within 0.05; normalised ≥
un-normalised + 0.3; classifier ≥ 0.95 on ground truth; stage-2 emotion accuracy ≥ 0.8, stage 1 ≤ 0.4;
lip-sync with emotion ≥ lip-sync − 0.05; stage-1 weights bit-identical after stage 2. Quick: lip-sync ≥ 0.5,
above the shuffled-audio baseline, and the zero-initialised branch leaves stage-1 outputs unchanged. The
broken variant (``variant="joint_scale"``: one joint mean–std for all attributes instead of per-attribute
normalisation) fails the quick gate.

Run: ``python -m icml25.generative_models.experiments.playmate [--full] [--seed N] [--out DIR]``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from icml25.generative_models.playmate import (
    AudioToMotionDiT,
    EmotionControlBranch,
    MotionNormalizer,
    guided_velocity,
    mouth_opening,
    sample_motion,
)
from icml25.generative_models.playmate_toy import SyntheticTalkingFaces
from icml25.generative_models.playmate_training import train_stage1, train_stage2
from icml25.kernels.experiment import (
    Check,
    Report,
    experiment_main,
    new_figure,
    save_figure,
    seed_everything,
    threshold_text,
    torch_threads,
)

PAPER = "P41"
CLAIM = (
    "A flow-matching DiT over per-attribute-normalised 3D-implicit keypoint motion follows the audio (lip "
    "sync) with pose replaceable by a driver, and a zero-initialised emotion branch on the frozen stage-1 "
    "model adds emotion control (paper: better FID/FVD than Hallo/EchoMimic/Sonic-type baselines, "
    "competitive Sync-C, emotion and pose control)."
)
LIPSYNC_FULL, LIPSYNC_QUICK, SHUFFLED_MAX = 0.8, 0.5, 0.2
POSE_TOL, LIPSYNC_DELTA, NORM_GAP = 1e-5, 0.05, 0.3
CLASSIFIER_MIN, EMOTION_MIN, STAGE1_EMOTION_MAX = 0.95, 0.8, 0.4


@dataclass(frozen=True)
class Setting:
    """One reproduction scale."""

    n_train: int
    """Training sequences (plan: 3,000; quick 300)."""
    n_test: int
    """Held-out sequences (plan: 300; full 200 for the CPU budget)."""
    n_frames: int
    """Frames per clip T (plan: 50)."""
    n_prev: int
    """Previous-clip frames conditioned on (the paper conditions on the previous clip; ours 4)."""
    width: int
    """DiT width (plan: 96; ours 64 in full, 48 in quick, for the shared 2-core CPU)."""
    depth: int
    """DiT blocks (plan: 4)."""
    stage1_steps: int
    """Stage-1 Adam steps (each model, normalised and joint-scale)."""
    stage2_steps: int
    """Stage-2 (emotion branch) Adam steps; 0 skips stage 2 (quick)."""
    batch_size: int
    """Training batch."""
    sample_steps: int
    """Euler steps of the sampler (plan: 20)."""
    joint_scale_baseline: bool
    """Train the un-normalised (joint-scale) ablation too (full)."""
    cfg_audio: float = 2.0
    """Audio guidance scale (unverified in the paper: ours)."""
    cfg_emotion: float = 2.0
    """Emotion guidance scale (unverified in the paper: ours)."""
    lr: float = 2e-3


FULL = Setting(n_train=3000, n_test=200, n_frames=50, n_prev=4, width=64, depth=4, stage1_steps=600,
               stage2_steps=400, batch_size=32, sample_steps=20, joint_scale_baseline=True)  # fmt: skip
QUICK = Setting(n_train=300, n_test=50, n_frames=50, n_prev=4, width=48, depth=2, stage1_steps=200,
                stage2_steps=0, batch_size=16, sample_steps=10, joint_scale_baseline=False)  # fmt: skip


def checks(setting: Setting) -> list[Check]:
    """The pass rule of ``setting`` (see the module docstring)."""
    if not setting.stage2_steps:
        return [
            Check(f"lip-sync >= {LIPSYNC_QUICK:g}", lambda m: m["lipsync"] >= LIPSYNC_QUICK),
            Check(
                "lip-sync > shuffled-audio lip-sync", lambda m: m["lipsync"] > m["baseline_lipsync_shuffled"]
            ),
            Check(
                "zero-init emotion branch leaves stage-1 outputs unchanged",
                lambda m: m["zero_init_max_diff"] == 0,
            ),
        ]
    return [
        Check(f"lip-sync >= {LIPSYNC_FULL:g}", lambda m: m["lipsync"] >= LIPSYNC_FULL),
        Check(
            f"shuffled-audio lip-sync <= {SHUFFLED_MAX:g}",
            lambda m: m["baseline_lipsync_shuffled"] <= SHUFFLED_MAX,
        ),
        Check(
            f"imposed pose: error <= {POSE_TOL:g} and lip-sync within {LIPSYNC_DELTA:g}",
            lambda m: m["pose_error"] <= POSE_TOL and abs(m["lipsync_pose"] - m["lipsync"]) <= LIPSYNC_DELTA,
        ),
        Check(
            f"lip-sync >= joint-scale (un-normalised) lip-sync + {NORM_GAP:g}",
            lambda m: m["lipsync"] >= m["lipsync_joint_scale"] + NORM_GAP,
        ),
        Check(
            f"emotion classifier on ground truth >= {CLASSIFIER_MIN:g}",
            lambda m: m["classifier_acc"] >= CLASSIFIER_MIN,
        ),
        Check(f"stage-2 emotion accuracy >= {EMOTION_MIN:g}", lambda m: m["emotion_acc"] >= EMOTION_MIN),
        Check(
            f"stage-1 emotion accuracy <= {STAGE1_EMOTION_MAX:g}",
            lambda m: m["stage1_emotion_acc"] <= STAGE1_EMOTION_MAX,
        ),
        Check(
            f"lip-sync with emotion >= lip-sync - {LIPSYNC_DELTA:g}",
            lambda m: m["lipsync_emotion"] >= m["lipsync"] - LIPSYNC_DELTA,
        ),
        Check("stage-1 weights bit-identical after stage 2", lambda m: m["stage1_identical"] == 1),
    ]


def threshold(quick: bool = True) -> str:
    """The pass rule in words, as :func:`run` reports it."""
    return threshold_text(checks(QUICK if quick else FULL))


def lipsync(opening: torch.Tensor, envelope: torch.Tensor) -> float:
    """Mean per-sequence Pearson correlation of ``opening`` and ``envelope`` ``[N, T]``."""
    a = opening - opening.mean(1, keepdim=True)
    b = envelope - envelope.mean(1, keepdim=True)
    return float(((a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1)).clamp_min(1e-12)).mean())


def _features(exp: torch.Tensor) -> np.ndarray:
    """Emotion-classifier features: the time-mean expression code ``[N, 3K]``."""
    return exp.mean(1).flatten(1).numpy()


def evaluate(
    setting: Setting, seed: int = 0, out_dir: str | Path | None = None, variant: str = "none"
) -> Report:
    """Measure every metric of :func:`checks` (``variant="joint_scale"``: the broken variant)."""
    if variant not in ("none", "joint_scale"):
        raise ValueError(f"variant must be 'none' or 'joint_scale', got {variant!r}")
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    s, k, p = setting, 20, setting.n_prev
    faces = SyntheticTalkingFaces(seed=seed)
    tr = faces.sample(s.n_train, p + s.n_frames, seed=seed + 1)
    te = faces.sample(s.n_test, p + s.n_frames, seed=seed + 2)
    env = te.envelope[:, p:]
    audio_tr, audio_te = tr.audio[:, p:], te.audio[:, p:]

    def new_dit() -> AudioToMotionDiT:
        return AudioToMotionDiT(3 * k + 7, faces.audio_dim, 3 * k, s.n_frames, width=s.width, depth=s.depth,
                                n_prev=p, seed=seed)  # fmt: skip

    def stage1(mode: str) -> tuple[AudioToMotionDiT, MotionNormalizer, list[float]]:
        norm = MotionNormalizer(k, mode).fit(tr.codes)
        dit = new_dit()
        losses = train_stage1(dit, norm, tr.codes, audio_tr, tr.ref, steps=s.stage1_steps,
                              batch_size=s.batch_size, lr=s.lr, seed=seed)  # fmt: skip
        return dit, norm, losses

    def gen(dit, norm, audio, **kw) -> dict[str, torch.Tensor]:
        return sample_motion(dit, audio, te.ref, normalizer=norm, steps=s.sample_steps, cfg_audio=s.cfg_audio,
                             cfg_emotion=s.cfg_emotion, seed=seed + 3, **kw)  # fmt: skip

    def sync(out: dict[str, torch.Tensor]) -> float:
        return lipsync(mouth_opening(out["exp"], faces.UPPER_LIP, faces.LOWER_LIP), env)

    metrics: dict[str, float] = {}
    dit, norm, losses = stage1("global" if variant == "joint_scale" else "attribute")
    metrics["stage1_loss_last50"] = float(np.mean(losses[-50:]))
    base = gen(dit, norm, audio_te)
    shuffled = gen(dit, norm, audio_te.roll(1, 0))
    metrics["lipsync"] = sync(base)
    metrics["baseline_lipsync_shuffled"] = sync(shuffled)

    # a zero-initialised branch leaves stage 1 unchanged (exactly)
    branch = EmotionControlBranch(dit, faces.n_emotions, seed=seed)
    x = torch.randn(4, s.n_frames, 3 * k + 7, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        v1 = guided_velocity(dit, x, 0.3, audio_te[:4], te.ref[:4], cfg_audio=1.0)
        v2 = guided_velocity(dit, x, 0.3, audio_te[:4], te.ref[:4], branch=branch, emotion=te.emotion[:4],
                             cfg_audio=1.0, cfg_emotion=1.0)  # fmt: skip
    metrics["zero_init_max_diff"] = float((v1 - v2).abs().max())

    curves = {"method": mouth_opening(base["exp"], faces.UPPER_LIP, faces.LOWER_LIP)[0],
              "shuffled audio": mouth_opening(shuffled["exp"], faces.UPPER_LIP, faces.LOWER_LIP)[0]}  # fmt: skip
    acc: dict[str, float] = {}
    if s.stage2_steps:
        # imposed driving pose: another test sequence's pose
        drv_raw = te.codes[:, p:].roll(2, 0)
        driver = {"rot": drv_raw[..., 3 * k : 3 * k + 3], "trans": drv_raw[..., 3 * k + 3 : 3 * k + 6],
                  "scale": drv_raw[..., 3 * k + 6 :]}  # fmt: skip
        posed = gen(dit, norm, audio_te, pose=driver)
        metrics["pose_error"] = max(float((posed[key] - driver[key]).abs().max()) for key in driver)
        metrics["lipsync_pose"] = sync(posed)
        # the un-normalised (joint-scale) ablation, same network and steps
        if s.joint_scale_baseline:
            dit_j, norm_j, _ = stage1("global")
            joint = gen(dit_j, norm_j, audio_te)
            metrics["lipsync_joint_scale"] = sync(joint)
            curves["joint-scale codes"] = mouth_opening(joint["exp"], faces.UPPER_LIP, faces.LOWER_LIP)[0]
        # emotion classifier on ground-truth codes
        n_cls = s.n_train
        clf = LogisticRegression(max_iter=2000, C=10.0)
        clf.fit(_features(tr.codes[:, p:, : 3 * k].unflatten(-1, (k, 3))[:n_cls]), tr.emotion[:n_cls].numpy())
        metrics["classifier_acc"] = float(clf.score(_features(te.codes[:, p:, : 3 * k].unflatten(-1, (k, 3))),
                                                    te.emotion.numpy()))  # fmt: skip
        # stage 2 on the frozen stage 1
        before = {name: v.clone() for name, v in dit.state_dict().items()}
        losses2 = train_stage2(branch, dit, norm, tr.codes, audio_tr, tr.ref, tr.emotion, steps=s.stage2_steps,
                               batch_size=s.batch_size, lr=s.lr, seed=seed + 4)  # fmt: skip
        metrics["stage2_loss_last50"] = float(np.mean(losses2[-50:]))
        metrics["stage1_identical"] = float(
            all(torch.equal(before[n], v) for n, v in dit.state_dict().items())
        )
        requested = torch.randint(
            0, faces.n_emotions, (s.n_test,), generator=torch.Generator().manual_seed(seed + 5)
        )
        emo = gen(dit, norm, audio_te, branch=branch, emotion=requested)
        metrics["emotion_acc"] = float((clf.predict(_features(emo["exp"])) == requested.numpy()).mean())
        metrics["stage1_emotion_acc"] = float(
            (clf.predict(_features(base["exp"])) == requested.numpy()).mean()
        )
        metrics["lipsync_emotion"] = sync(emo)
        acc = {"stage 2 (label)": metrics["emotion_acc"], "stage 1 (no label)": metrics["stage1_emotion_acc"],
               "ground truth": metrics["classifier_acc"]}  # fmt: skip
    metrics["total_seconds"] = time.perf_counter() - t0
    figures = [plot(out_dir, env[0], curves, acc)] if out_dir is not None else []
    return Report.from_checks(
        paper=PAPER,
        claim=CLAIM,
        checks=checks(setting),
        metrics=metrics,
        headline="lipsync",
        baseline="baseline_lipsync_shuffled",
        figures=figures,
        seeds=[seed],
        notes=(
            f"Synthetic motion space, no pixels: {s.n_train} train / {s.n_test} test sequences of {s.n_frames} "
            f"frames (+{p} previous-clip frames), 20 keypoints, 4 emotions, 40 identities. DiT width "
            f"{s.width}, depth {s.depth}, {s.stage1_steps} stage-1 steps"
            f"{f', {s.stage2_steps} stage-2 steps' if s.stage2_steps else ''} (batch {s.batch_size}); "
            f"{s.sample_steps} Euler steps, CFG audio {s.cfg_audio:g}, emotion {s.cfg_emotion:g}. "
            f"Variant: {variant}."
        ),
    )


def plot(
    out_dir: str | Path, envelope: torch.Tensor, curves: dict[str, torch.Tensor], acc: dict[str, float]
) -> Path:
    """Mouth opening vs the audio envelope on one test clip; emotion accuracies."""
    fig, (ax, ax2) = new_figure(1, 2, figsize=(11, 4))

    def std(v: torch.Tensor) -> np.ndarray:
        return ((v - v.mean()) / v.std().clamp_min(1e-12)).numpy()

    ax.plot(std(envelope), "k--", lw=1.5, label="audio envelope")
    for name, c in curves.items():
        ax.plot(std(c), lw=1.2, label=f"{name} (raw std {float(c.std()):.2g})")
    ax.set_xlabel("frame")
    ax.set_ylabel("mouth opening (standardised)")
    ax.legend(fontsize=8)
    ax.set_title("P41 Playmate: lip sync on a test clip")
    if acc:
        ax2.bar(list(acc), list(acc.values()))
        ax2.axhline(0.25, color="k", ls=":", lw=1, label="chance")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("emotion accuracy")
        ax2.legend(fontsize=8)
    else:
        ax2.set_axis_off()
    fig.tight_layout()
    return save_figure(fig, out_dir, "p41_playmate")


def run(quick: bool = True, seed: int = 0, out_dir: str | Path | None = None) -> Report:
    """Reproduce the Playmate motion-space checks (see the module docstring)."""
    seed_everything(seed)
    with torch_threads(1):
        return evaluate(QUICK if quick else FULL, seed, out_dir=out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    return experiment_main(run, argv, description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
