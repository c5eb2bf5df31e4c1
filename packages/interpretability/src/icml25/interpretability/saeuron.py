"""SAeUron: Interpretable Concept Unlearning in Diffusion Models with Sparse Autoencoders — ICML 2025, P19: the method.

Cywiński & Deja, ICML 2025 (arXiv 2501.18052; official code ``cywinski/SAeUron``). One sparse autoencoder is
trained, unsupervised, on the activations of one block of a diffusion model pooled over all denoising steps;
features that carry a concept at a timestep are found by contrasting the concept's prompts with the other
concepts' prompts, and during sampling those features are scaled by a negative factor where they fire above
their cross-concept average. The SAE's reconstruction error is added back, so everything the SAE does not
change passes through unchanged. No fine-tuning.

Pieces (all shapes documented on each function):

* **layout** — :func:`to_patches` / :func:`from_patches`: a block output ``[N, d]``, ``[B, P, d]`` or
  ``[B, C, H, W]`` (``C = d``, any ``H``, ``W``) ↔ one SAE input per spatial position ``[N·P, d]``;
* **capture** — :class:`ActivationCapture`: a forward hook on a named module of any ``torch.nn.Module``
  (a diffusers ``UNet2DModel`` block included) storing its output at every sampling step;
* **SAE** — :func:`fit_block_sae` trains the shared P22 :class:`~icml25.interpretability.sae.BatchTopKSAE`
  (or a :class:`~icml25.interpretability.sae.TopKSAE` with AuxK) on pooled patches; inference is per-patch
  top-k, decoded with the shared ``icml25.kernels.topk_decode`` op; :func:`concept_latents` turns captured
  activations into the per-prompt, per-step, space-averaged latents ``A_c [n, T, F]``;
* **score and selection** — :func:`concept_feature_scores`
  ``score(i, t, c) = μ(i,t,c)/Σ_j μ(j,t,c) − μ(i,t,¬c)/Σ_j μ(j,t,¬c)`` (ε = 1e-8 in the sums; ¬c pools the
  other concepts' prompts) and :func:`select_features` (scores strictly above ``torch.quantile(scores,
  q/100)``), gathered per step by :meth:`UnlearningPlan.build`;
* **intervention** — :func:`intervene` and the hook :class:`SAEUnlearningHook`: on every patch code z, where
  a selected feature satisfies ``z_i > m̄(i,t)`` (the mean over all concepts of μ(i,t,·)), ``z_i ← z_i·γ·μ(i,t,c)``;
  the output is ``x + (x̃ − x̂)`` (decoded edited code x̃, reconstruction x̂), which is ``x`` bit for bit
  where nothing fired. ``legacy_error_sign=True`` gives the official hook's ``x̃ + (x̂ − x)`` (= ``2x̂ − x``
  where nothing fired);
* **a tiny diffusion model** — :class:`DigitsDDPM` (a class-conditional MLP denoiser for 8×8 digits whose
  ``block`` adds the time and class embeddings), :func:`train_ddpm` and :func:`ddpm_sample`.

The timestep index of a hook is set explicitly (:meth:`SAEUnlearningHook.set_step`, or the diffusers-style
``callback_on_step_end``), not by counting calls; ``count_calls=True`` gives the official counter.
"""

from __future__ import annotations

import abc
import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from icml25.interpretability.sae.base import BatchTopKSAE, SparseAutoencoder, TopKSAE, topk_relu
from icml25.interpretability.sae.training import train_sae
from icml25.kernels.checks import check_float, check_int, check_tensor
from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "ActivationCapture",
    "DigitsDDPM",
    "SAEUnlearningHook",
    "UnlearningPlan",
    "concept_feature_scores",
    "concept_latents",
    "ddpm_sample",
    "fit_block_sae",
    "from_patches",
    "intervene",
    "select_features",
    "to_patches",
    "train_ddpm",
]

EPS = 1e-8
"""ε added to the activation sums of the score (official ``compute_feature_importance``)."""


# ----------------------------------------------------------------------------------------------- checks
def _sae(sae: Any) -> SparseAutoencoder:
    if not isinstance(sae, SparseAutoencoder):
        raise TypeError(f"sae must be a SparseAutoencoder (e.g. TopKSAE), got {type(sae).__name__}")
    return sae


# ----------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class _Layout:
    shape: tuple[int, ...]
    channels_first: bool


def to_patches(acts: torch.Tensor) -> tuple[torch.Tensor, tuple[tuple[int, ...], bool]]:
    """One SAE input per spatial position: ``[N, d]`` → ``[N, d]``, ``[B, P, d]`` → ``[B·P, d]``,
    ``[B, C, H, W]`` → ``[B·H·W, C]`` (channels are the SAE's ``d``; ``H ≠ W`` is fine).

    Returns ``(patches, layout)``; :func:`from_patches` with that ``layout`` inverts it exactly.
    """
    check_tensor(acts, "acts", dtype=None, finite=False)
    if acts.ndim not in (2, 3, 4):
        raise ValueError(f"acts must be [N, d], [B, P, d] or [B, C, H, W], got shape {tuple(acts.shape)}")
    if acts.ndim == 4:
        B, C, H, W = acts.shape
        return acts.permute(0, 2, 3, 1).reshape(B * H * W, C), (tuple(acts.shape), True)
    return acts.reshape(-1, acts.shape[-1]), (tuple(acts.shape), False)


def from_patches(patches: torch.Tensor, layout: tuple[tuple[int, ...], bool]) -> torch.Tensor:
    """Inverse of :func:`to_patches`: ``[B·H·W, C]`` → ``[B, C, H, W]`` (or the original ``[N, d]`` /
    ``[B, P, d]``) for the ``layout`` it returned."""
    check_tensor(patches, "patches", dtype=None, finite=False)
    if not (isinstance(layout, tuple) and len(layout) == 2 and isinstance(layout[0], tuple)):
        raise TypeError(f"layout must be the (shape, channels_first) pair from to_patches, got {layout!r}")
    shape, channels_first = layout
    n = math.prod(shape)
    if (
        patches.ndim != 2
        or patches.numel() != n
        or patches.shape[1] != (shape[1] if channels_first else shape[-1])
    ):
        raise ValueError(f"patches of shape {tuple(patches.shape)} do not fit the layout {shape}")
    if channels_first:
        B, C, H, W = shape
        return patches.reshape(B, H, W, C).permute(0, 3, 1, 2)
    return patches.reshape(shape)


# ----------------------------------------------------------------------------------------------- hooks
def _replace_output(output: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to the hidden-state tensor of a module output: a tensor, the first item of a tuple, or
    the ``sample`` field of a diffusers ``BaseOutput``."""
    if isinstance(output, torch.Tensor):
        return fn(output)
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return (fn(output[0]), *output[1:])
    sample = getattr(output, "sample", None)
    if isinstance(sample, torch.Tensor):
        output.sample = fn(sample)
        if isinstance(output, dict):
            output["sample"] = output.sample
        return output
    raise TypeError(
        f"the hooked module returned {type(output).__name__}; expected a tensor, a tuple starting with one, or "
        "an output with a .sample tensor"
    )


def _hidden(output: Any) -> torch.Tensor:
    box: list[torch.Tensor] = []
    _replace_output(output, lambda t: box.append(t) or t)
    return box[0]


class _BlockHook(abc.ABC):
    """A forward hook on ``model.get_submodule(block)`` with a sampling-step index (shared plumbing)."""

    def __init__(self, model: nn.Module, block: str, n_steps: int, count_calls: bool) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(block, str):
            raise TypeError(
                f"block must be a module name (str) such as 'up_blocks.1', got {type(block).__name__}"
            )
        try:
            self.module = model.get_submodule(block)
        except AttributeError:
            names = [n for n, _ in model.named_modules() if n][:20]
            raise ValueError(
                f"block {block!r} is not a submodule of {type(model).__name__}; some are {names}"
            ) from None
        self.block = block
        self.n_steps = check_int(n_steps, "n_steps", low=1)
        if not isinstance(count_calls, bool):
            raise TypeError(f"count_calls must be a bool, got {type(count_calls).__name__}")
        self.count_calls = count_calls
        self.step = 0
        self._handle: Any = None

    # step control
    def set_step(self, step: int) -> None:
        """Set the sampling-step index (0 = the first, noisiest step) used by the next forward calls."""
        self.step = check_int(step, "step", low=0, high=self.n_steps - 1)

    def reset(self) -> None:
        """Start a new generation (step 0)."""
        self.step = 0

    def check_steps(self, n_steps: int) -> None:
        """Raise ``ValueError`` if a sampler running ``n_steps`` steps does not match this hook's ``n_steps``."""
        if n_steps != self.n_steps:
            raise ValueError(
                f"{type(self).__name__} covers n_steps={self.n_steps} sampling steps, but the sampler runs "
                f"{n_steps}: rebuild the statistics/plan for {n_steps} steps"
            )

    def callback_on_step_end(self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:
        """A diffusers ``callback_on_step_end``: after step ``step`` the next call is step ``step + 1``; after the
        last step the hook resets for the next generation. Checks ``pipe.num_timesteps`` when the pipeline has it."""
        total = getattr(pipe, "num_timesteps", None)
        if isinstance(total, int):
            self.check_steps(total)
        self.step = 0 if step + 1 >= self.n_steps else step + 1
        return callback_kwargs

    def _current(self) -> int:
        if self.step >= self.n_steps:
            raise ValueError(
                f"{type(self).__name__} covers n_steps={self.n_steps} sampling steps, got a call at step "
                f"{self.step}: the sampler runs more steps (or calls the model more than once per step)"
            )
        return self.step

    def _advance(self) -> None:
        if self.count_calls:
            self.step += 1

    # registration
    def attach(self) -> _BlockHook:
        if self._handle is None:
            self._handle = self.module.register_forward_hook(self._hook)
        return self

    def remove(self) -> None:
        """Remove the forward hook (the model is unhooked again)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __enter__(self) -> Any:
        return self.attach()

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    @abc.abstractmethod
    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        """The forward hook: record or replace ``output`` at the current step."""


class ActivationCapture(_BlockHook):
    """Record the output of ``model.<block>`` at every sampling step (``with ActivationCapture(...) as cap:``).

    Each call at step ``t`` stores the output as patches ``[B, P, d]`` (``P = H·W`` for a ``[B, C, H, W]``
    output, 1 for ``[B, d]``) on the CPU in float32. Steps advance through :meth:`set_step` (or
    ``count_calls=True``, or ``callback_on_step_end``); :meth:`activations` stacks the recorded generations.

    Args:
        model: any ``torch.nn.Module`` (e.g. :class:`DigitsDDPM`, a diffusers ``UNet2DModel``).
        block: the hooked submodule's name (``"block"``, ``"up_blocks.1"``, ``"up_blocks.1.attentions.1"``).
        n_steps: sampling steps per generation T.
        count_calls: advance the step after every call (the official behaviour) instead of explicitly.
    """

    def __init__(self, model: nn.Module, block: str, n_steps: int, *, count_calls: bool = False) -> None:
        super().__init__(model, block, n_steps, count_calls)
        self._store: list[list[torch.Tensor]] = [[] for _ in range(self.n_steps)]

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        t = self._current()
        h = _hidden(output).detach()
        patches, (shape, _) = to_patches(h)
        self._store[t].append(patches.reshape(shape[0], -1, patches.shape[-1]).float().cpu())
        self._advance()

    def clear(self) -> None:
        """Drop everything recorded and reset the step."""
        self._store = [[] for _ in range(self.n_steps)]
        self.reset()

    def activations(self) -> torch.Tensor:
        """The recorded outputs ``[N, T, P, d]`` (N samples over all recorded generations)."""
        counts = [sum(a.shape[0] for a in s) for s in self._store]
        if counts[0] == 0 or len(set(counts)) != 1:
            raise ValueError(
                f"ActivationCapture holds samples per step {counts}; every one of the n_steps={self.n_steps} steps "
                "must be recorded equally often (run whole generations)"
            )
        return torch.stack([torch.cat(s) for s in self._store], dim=1)


# ----------------------------------------------------------------------------------------------- SAE
def fit_block_sae(
    acts: torch.Tensor,
    d_sae: int,
    k: int,
    *,
    steps: int,
    batch_size: int = 4096,
    lr: float = 4e-4,
    batch_topk: bool = True,
    aux_k: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
) -> SparseAutoencoder:
    """Train the block's SAE on captured activations pooled over steps and positions.

    Args:
        acts: ``[..., d]`` activations (e.g. ``ActivationCapture.activations()`` ``[N, T, P, d]``); every
            leading index is one SAE input.
        d_sae: latents F (paper: expansion 16, 20,480 for d = 1,280).
        k: active latents per input (paper 32).
        steps, batch_size, lr: the P22 training loop's budget (paper: lr 4e-4 with linear decay, batch 4,096).
        batch_topk: train a :class:`BatchTopKSAE` (the paper) or a :class:`TopKSAE` with AuxK (``aux_k``).
        seed: initial weights and batch order (local generators).

    Returns:
        the trained SAE in eval mode; :func:`intervene` runs it with per-patch top-k (as the official code).
    """
    acts = check_tensor(acts, "acts")
    if acts.ndim < 2 or acts.numel() == 0:
        raise ValueError(f"acts must be a non-empty tensor [..., d], got shape {tuple(acts.shape)}")
    X = acts.reshape(-1, acts.shape[-1]).float()
    if X.shape[0] < 2 or bool((X.std(dim=0) == 0).all()):
        raise ValueError(
            f"acts must vary across inputs (got {X.shape[0]} constant input(s) of dim {X.shape[1]})"
        )
    d_sae = check_int(d_sae, "d_sae", low=1)
    k = check_int(k, "k", low=1, high=d_sae)
    if not isinstance(batch_topk, bool):
        raise TypeError(f"batch_topk must be a bool, got {type(batch_topk).__name__}")
    if batch_topk:
        sae: SparseAutoencoder = BatchTopKSAE(X.shape[1], d_sae, k, loss_kind="mse", seed=seed)
    else:
        sae = TopKSAE(
            X.shape[1], d_sae, k, aux_k=aux_k, dead_after=max(1, X.shape[0]), loss_kind="mse", seed=seed
        )
    with torch.enable_grad():  # also inside a caller's no_grad block
        train_sae(
            sae, X, steps=steps, batch_size=batch_size, lr=lr, decay_start=0.0, seed=seed, progress=progress
        )
    return sae.eval()


def _topk_codes(sae: SparseAutoencoder, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-patch top-k codes ``(values, idx)`` ``[N, k]`` of x ``[N, d]`` (all latents when the SAE has no k)."""
    pre = sae.pre_activations(x)
    k = getattr(sae, "k", None)
    if not isinstance(k, int):
        k = sae.d_sae
    return topk_relu(pre, min(k, sae.d_sae))


@torch.no_grad()
def concept_latents(
    sae: SparseAutoencoder, acts_by_concept: Mapping[str, torch.Tensor], *, batch_size: int = 65536
) -> dict[str, torch.Tensor]:
    """Space-averaged per-patch top-k latents of every concept's captured activations.

    Args:
        sae: the block's SAE (``d_in = d``).
        acts_by_concept: ``{concept: [n, T, P, d]}`` (e.g. one :class:`ActivationCapture` per concept's prompts).
        batch_size: patches encoded at once (whole images: at least one image of P patches per chunk).

    Returns:
        ``{concept: A_c [n, T, F]}``: the mean over the P positions of each patch's top-k code.
    """
    sae = _sae(sae)
    batch_size = check_int(batch_size, "batch_size", low=1)
    if not isinstance(acts_by_concept, Mapping) or not acts_by_concept:
        raise ValueError(
            f"acts_by_concept must be a non-empty {{concept: [n, T, P, d]}} mapping, got {acts_by_concept!r}"
        )
    out: dict[str, torch.Tensor] = {}
    shape_T = None
    for c, a in acts_by_concept.items():
        name = f"acts_by_concept[{c!r}]"
        a = check_tensor(a, name)
        if a.ndim != 4 or a.shape[-1] != sae.d_in or 0 in a.shape:
            raise ValueError(
                f"{name} must be a non-empty [n, T, P, d={sae.d_in}] tensor, got {tuple(a.shape)}"
            )
        if shape_T is not None and a.shape[1] != shape_T:
            raise ValueError(f"{name} has T={a.shape[1]} steps, the other concepts {shape_T}")
        shape_T = a.shape[1]
        n, T, P, d = a.shape
        items = a.reshape(n * T, P, d)
        mean = torch.empty(n * T, sae.d_sae, dtype=sae.W_enc.dtype)
        rows = max(
            1, batch_size // P
        )  # whole images per chunk: the dense codes never exceed ~batch_size rows
        for i in range(0, n * T, rows):
            flat = items[i : i + rows].reshape(-1, d).to(sae.W_enc.dtype)
            v, idx = _topk_codes(sae, flat)
            z = torch.zeros(flat.shape[0], sae.d_sae, dtype=flat.dtype).scatter_(1, idx, v)
            mean[i : i + rows] = z.reshape(-1, P, sae.d_sae).mean(dim=1)
        out[str(c)] = mean.reshape(n, T, sae.d_sae)
    return out


# ----------------------------------------------------------------------------------------------- score
def _check_latents(latents: Any) -> dict[str, torch.Tensor]:
    if not isinstance(latents, Mapping) or not latents:
        raise ValueError(
            f"latents must be a non-empty {{concept: [n, T, F]}} mapping, got {type(latents).__name__}"
        )
    shape = None
    for c, a in latents.items():
        if not isinstance(c, str):
            raise TypeError(f"latents keys must be concept names (str), got {type(c).__name__} {c!r}")
        name = f"latents[{c!r}]"
        a = check_tensor(a, name)
        if a.ndim != 3 or 0 in a.shape:
            raise ValueError(
                f"{name} must be a non-empty [n_prompts, T, F] tensor, got shape {tuple(a.shape)}"
            )
        if bool((a < 0).any()):
            raise ValueError(f"{name} must be non-negative (ReLU SAE latents), got min {float(a.min()):.3g}")
        if shape is not None and a.shape[1:] != shape:
            raise ValueError(f"{name} has (T, F) = {tuple(a.shape[1:])}, other concepts {tuple(shape)}")
        shape = a.shape[1:]
    return dict(latents)


def _concept(latents: Mapping[str, torch.Tensor], concept: Any, name: str = "concept") -> str:
    if not isinstance(concept, str):
        raise TypeError(f"{name} must be a concept name (str), got {type(concept).__name__} {concept!r}")
    if concept not in latents:
        raise ValueError(f"{name} {concept!r} is unknown; available concepts: {sorted(latents)}")
    return concept


def concept_feature_scores(
    latents: Mapping[str, torch.Tensor], concept: str, t: int | None = None, eps: float = EPS
) -> torch.Tensor:
    """The paper's feature importance of ``concept``: ``μ_c/Σμ_c − μ_¬c/Σμ_¬c`` per step and feature.

    Args:
        latents: ``{concept: A_c [n_prompts, T, F]}`` non-negative latents (:func:`concept_latents`).
        concept: the target concept c.
        t: a step index (returns ``[F]``) or ``None`` (all steps, ``[T, F]``).
        eps: added to both activation sums (official 1e-8).

    ``μ(i,t,c)`` is the mean over c's prompts, ``μ(i,t,¬c)`` the mean over all other concepts' prompts pooled.
    Each proportion sums to 1 over features (up to ε), so the scores sum to ≈ 0. With a single concept the
    official code returns the raw mean μ_c, and so does this function.
    """
    latents = _check_latents(latents)
    concept = _concept(latents, concept)
    eps = check_float(eps, "eps", low=0.0)
    T = next(iter(latents.values())).shape[1]
    if t is not None:
        t = check_int(t, "t", low=0, high=T - 1)
    mu_c = latents[concept].double().mean(dim=0)  # [T, F]
    others = [a for c, a in latents.items() if c != concept]
    if not others:
        score = mu_c
    else:
        mu_o = torch.cat(others).double().mean(dim=0)
        sums = {
            "the concept's": mu_c.sum(-1, keepdim=True),
            "the other concepts'": mu_o.sum(-1, keepdim=True),
        }
        for who, total in sums.items():
            if eps == 0 and bool((total == 0).any()):
                steps = torch.nonzero(total.flatten() == 0).flatten().tolist()
                raise ValueError(
                    f"eps=0 with all-zero latents: {who} activations sum to 0 at steps {steps[:10]}, so its "
                    "proportions would be 0/0 (NaN); use eps > 0 (official 1e-8: the all-zero step scores 0)"
                )
        score = mu_c / (sums["the concept's"] + eps) - mu_o / (sums["the other concepts'"] + eps)
    score = score.to(latents[concept].dtype)
    return score if t is None else score[t]


def select_features(scores: torch.Tensor, percentile: float) -> torch.Tensor:
    """Indices (ascending, ``int64``) of the scores strictly above their ``percentile``-th percentile.

    The percentile is ``torch.quantile(scores, percentile / 100)`` (linear interpolation), as the official
    ``get_percentile_threshold``. Constant scores select nothing.

    Args:
        scores: ``[F]`` finite scores of one step.
        percentile: q in the open interval (0, 100) (paper: 99.99–99.999 of 20,480 features).
    """
    scores = check_tensor(scores, "scores")
    if scores.ndim != 1 or scores.numel() == 0:
        raise ValueError(f"scores must be a non-empty [F] tensor, got shape {tuple(scores.shape)}")
    q = check_float(percentile, "percentile", low=0.0, high=100.0, low_open=True, high_open=True)
    thr = torch.quantile(scores.double(), q / 100)
    return torch.nonzero(scores.double() > thr).flatten()


# ----------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class UnlearningPlan:
    """What :func:`intervene` does at each step: features, their scales and the firing thresholds.

    Attributes:
        concepts: the concepts being removed.
        indices: per step, ``[m_t]`` int64 selected features (deduplicated union over the concepts).
        scales: per step, ``[m_t]`` factors ``γ·μ(i,t,c)`` (for several concepts: γ times the largest μ among them).
        thresholds: ``[T, F]`` mask thresholds m̄(i,t), the mean over *all* concepts of μ(i,t,·).
        multiplier: γ.
    """

    concepts: tuple[str, ...]
    indices: tuple[torch.Tensor, ...]
    scales: tuple[torch.Tensor, ...]
    thresholds: torch.Tensor
    multiplier: float

    @property
    def n_steps(self) -> int:
        """Sampling steps T the plan covers."""
        return int(self.thresholds.shape[0])

    @property
    def d_sae(self) -> int:
        """SAE latents F."""
        return int(self.thresholds.shape[1])

    @property
    def n_features(self) -> list[int]:
        """Selected features per step."""
        return [int(i.numel()) for i in self.indices]

    @classmethod
    def build(
        cls,
        latents: Mapping[str, torch.Tensor],
        concepts: Sequence[str],
        percentile: float,
        multiplier: float,
        eps: float = EPS,
    ) -> UnlearningPlan:
        """Select, per step, the features scoring above the ``percentile`` for each of ``concepts``.

        Args:
            latents: ``{concept: [n_prompts, T, F]}`` (:func:`concept_latents`), all concepts (targets and others).
            concepts: the concepts to remove (their selections are united).
            percentile: q of :func:`select_features`.
            multiplier: γ (< 0 removes; ≥ 0 warns, it amplifies).
        """
        latents = _check_latents(latents)
        concepts = cls._concepts(latents, concepts)
        scores = {c: concept_feature_scores(latents, c, eps=eps) for c in concepts}
        T = next(iter(latents.values())).shape[1]
        check_float(percentile, "percentile", low=0.0, high=100.0, low_open=True, high_open=True)
        features = [
            torch.unique(torch.cat([select_features(scores[c][t], percentile) for c in concepts]))
            for t in range(T)
        ]
        return cls.from_features(latents, concepts, features, multiplier)

    @staticmethod
    def _concepts(latents: Mapping[str, torch.Tensor], concepts: Any) -> tuple[str, ...]:
        if isinstance(concepts, str) or not isinstance(concepts, Sequence) or not concepts:
            raise TypeError(f"concepts must be a non-empty list of concept names, got {concepts!r}")
        return tuple(dict.fromkeys(_concept(latents, c, "concepts item") for c in concepts))

    @classmethod
    def from_features(
        cls,
        latents: Mapping[str, torch.Tensor],
        concepts: Sequence[str],
        features: Sequence[torch.Tensor | Sequence[int]],
        multiplier: float,
    ) -> UnlearningPlan:
        """A plan with given features per step (baselines: random or raw-mean selections), scaled and
        thresholded like :meth:`build`. ``features[t]`` is a list/tensor of feature indices for step t."""
        latents = _check_latents(latents)
        concepts = cls._concepts(latents, concepts)
        gamma = check_float(multiplier, "multiplier")
        if gamma >= 0:
            warnings.warn(
                f"multiplier={gamma} >= 0 amplifies the selected features instead of removing the concept "
                "(SAeUron uses a negative multiplier)",
                UserWarning,
                stacklevel=2,
            )
        T, F_ = next(iter(latents.values())).shape[1:]
        if (
            isinstance(features, (str, torch.Tensor))
            or not isinstance(features, Sequence)
            or len(features) != T
        ):
            raise ValueError(
                f"features must be a list of T={T} index lists (one per step), got {type(features).__name__}"
            )
        mus = torch.stack([a.mean(dim=0) for a in latents.values()])  # [C, T, F]
        thresholds = mus.mean(dim=0)
        target = torch.stack([latents[c].mean(dim=0) for c in concepts]).amax(dim=0)  # [T, F]
        idx_t, scale_t = [], []
        for t, f in enumerate(features):
            idx = (
                torch.as_tensor(f, dtype=torch.long).flatten()
                if not isinstance(f, torch.Tensor)
                else f.flatten()
            )
            if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
                raise TypeError(f"features[{t}] must hold integer feature indices, got dtype {idx.dtype}")
            idx = torch.unique(idx.long())
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= F_):
                raise ValueError(
                    f"features[{t}] must be indices in [0, {F_}), got range [{int(idx.min())}, {int(idx.max())}]"
                )
            idx_t.append(idx)
            scale_t.append(gamma * target[t, idx])
        return cls(concepts, tuple(idx_t), tuple(scale_t), thresholds, gamma)


# ----------------------------------------------------------------------------------------------- intervene
@torch.no_grad()
def intervene(
    acts: torch.Tensor,
    sae: SparseAutoencoder,
    plan: UnlearningPlan,
    t: int,
    preserve_error: bool = True,
    legacy_error_sign: bool = False,
) -> torch.Tensor:
    """Remove the plan's concepts from a block output at sampling step ``t``.

    Args:
        acts: ``[N, d]``, ``[B, P, d]`` or ``[B, C, H, W]`` (``C = d = sae.d_in``); any floating dtype (cast
            to the SAE's dtype and back).
        sae: the block's SAE (per-patch top-k with its ``k``; an SAE without ``k`` uses its ReLU latents).
        plan: an :class:`UnlearningPlan` with ``plan.d_sae == sae.d_sae``.
        t: the step index, ``0 <= t < plan.n_steps``.
        preserve_error: add the SAE error back (the paper); ``False`` returns the decoded edited code x̃.
        legacy_error_sign: the official hook's ``x̃ + (x̂ − x)`` instead of the correct ``x + (x̃ − x̂)``.

    Returns:
        a tensor of ``acts``' shape and dtype. With ``preserve_error=True`` and the correct sign, every patch
        where no selected feature fired (nothing selected at ``t`` included) is returned bit for bit.
    """
    acts = check_tensor(acts, "acts")
    sae = _sae(sae)
    if not isinstance(plan, UnlearningPlan):
        raise TypeError(f"plan must be an UnlearningPlan, got {type(plan).__name__}")
    if plan.d_sae != sae.d_sae:
        raise ValueError(f"plan has d_sae={plan.d_sae} features, sae has d_sae={sae.d_sae}")
    t = check_int(t, "t", low=0, high=plan.n_steps - 1)
    for name, v in (("preserve_error", preserve_error), ("legacy_error_sign", legacy_error_sign)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    x, layout = to_patches(acts)
    if x.shape[1] != sae.d_in:
        raise ValueError(
            f"acts have {x.shape[1]} channels (layout {tuple(acts.shape)}), sae has d_in={sae.d_in}"
        )
    if x.shape[0] == 0:
        return acts.clone()
    xs = x.to(sae.W_enc.dtype)
    values, idx = _topk_codes(sae, xs)
    sel, scale = plan.indices[t].to(idx.device), plan.scales[t].to(xs.dtype)
    is_sel = torch.zeros(sae.d_sae, dtype=torch.bool, device=idx.device)
    is_sel[sel] = True
    factor = torch.ones(sae.d_sae, dtype=xs.dtype, device=xs.device)
    factor[sel] = scale.to(xs.device)
    thr = plan.thresholds[t].to(device=xs.device, dtype=xs.dtype)
    fire = is_sel[idx] & (values > thr[idx])  # [N, k]
    edited = torch.where(fire, values * factor[idx], values)
    if preserve_error and not legacy_error_sign:
        # Rows where nothing fired are the input itself, in its own memory layout (a permuted copy could make
        # the next layer pick another kernel and differ in the last bit).
        result = acts.clone()
        rows = torch.nonzero(fire.any(dim=1)).flatten()
        if rows.numel():
            delta = sae.decode_sparse(edited[rows], idx[rows]) - sae.decode_sparse(values[rows], idx[rows])
            new = (xs[rows] + delta).to(acts.dtype)
            if acts.ndim == 4:
                B, _, H, W = acts.shape
                b, h, w = torch.unravel_index(rows, (B, H, W))
                result[b, :, h, w] = new
            else:
                result[torch.unravel_index(rows, acts.shape[:-1])] = new
        return result
    new = sae.decode_sparse(edited, idx)
    out = new + (sae.decode_sparse(values, idx) - xs) if preserve_error else new
    return from_patches(out.to(acts.dtype), layout).contiguous()


class SAEUnlearningHook(_BlockHook):
    """A forward hook that runs :func:`intervene` on ``model.<block>``'s output at the current step.

    Works on any ``torch.nn.Module`` whose block returns a tensor ``[B, d]`` / ``[B, C, H, W]``, a tuple
    starting with one, or a diffusers output with ``.sample``; every batch row is processed (both
    classifier-free-guidance halves when the sampler batches them, any batch size otherwise). The step is
    set with :meth:`set_step` or ``callback_on_step_end`` (``count_calls=True``: the official counter); a
    call past ``plan.n_steps`` raises ``ValueError``. Use as ``with SAEUnlearningHook(...) as hook:``;
    leaving the block removes the hook.

    Args:
        model, block: the model and the hooked submodule's name.
        sae: the block's SAE (``sae.d_in`` = the block's channels).
        plan: the :class:`UnlearningPlan` (``plan.n_steps`` = the sampler's steps).
        preserve_error, legacy_error_sign: as in :func:`intervene`.
        count_calls: advance the step after every call instead of explicitly.
    """

    def __init__(
        self,
        model: nn.Module,
        block: str,
        sae: SparseAutoencoder,
        plan: UnlearningPlan,
        *,
        preserve_error: bool = True,
        legacy_error_sign: bool = False,
        count_calls: bool = False,
    ) -> None:
        sae = _sae(sae)
        if not isinstance(plan, UnlearningPlan):
            raise TypeError(f"plan must be an UnlearningPlan, got {type(plan).__name__}")
        if plan.d_sae != sae.d_sae:
            raise ValueError(f"plan has d_sae={plan.d_sae} features, sae has d_sae={sae.d_sae}")
        super().__init__(model, block, plan.n_steps, count_calls)
        self.sae, self.plan = sae, plan
        self.preserve_error, self.legacy_error_sign = preserve_error, legacy_error_sign

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        t = self._current()
        new = _replace_output(
            output,
            lambda h: intervene(h, self.sae, self.plan, t, self.preserve_error, self.legacy_error_sign),
        )
        self._advance()
        return new


# ----------------------------------------------------------------------------------------------- tiny DDPM
class _ConditionedInput(nn.Module):
    """``SiLU(W x + e_t[t] + e_c[y])``: the block where time and class enter (the hooked layer)."""

    def __init__(self, d: int, hidden: int, n_steps: int, n_classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, hidden)
        self.time = nn.Embedding(n_steps, hidden)
        self.label = nn.Embedding(n_classes, hidden)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.silu(self.proj(x) + self.time(t) + self.label(y))


class DigitsDDPM(nn.Module):
    """A tiny class-conditional DDPM denoiser for flattened 8×8 digits in [-1, 1] (ε-prediction).

    ``block`` (``[B, hidden]``, the hooked layer) adds learned time and class embeddings to the projected input;
    two more ``hidden``-wide SiLU layers and a linear head predict the noise ``[B, d]``. Linear β schedule
    from ``1e-4·1000/T`` to ``0.02·1000/T`` (the DDPM schedule rescaled to T steps).

    Args:
        d: pixels (64).
        hidden: width (256).
        n_steps: diffusion steps T (50).
        n_classes: classes (10).
        seed: initial weights from ``isolated_rng(seed)``; ``None`` draws from the global generator.
    """

    def __init__(
        self, d: int = 64, hidden: int = 256, n_steps: int = 50, n_classes: int = 10, seed: int | None = None
    ) -> None:
        super().__init__()
        self.d = check_int(d, "d", low=1)
        self.hidden = check_int(hidden, "hidden", low=1)
        self.n_steps = check_int(n_steps, "n_steps", low=2)
        self.n_classes = check_int(n_classes, "n_classes", low=1)
        with isolated_rng(seed) if seed is not None else contextlib.nullcontext():
            self.block = _ConditionedInput(d, hidden, n_steps, n_classes)
            self.mid = nn.Sequential(
                nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU()
            )
            self.head = nn.Linear(hidden, d)
        betas = torch.linspace(1e-4 * 1000 / n_steps, min(0.02 * 1000 / n_steps, 0.5), n_steps)
        self.register_buffer("betas", betas)
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - betas, 0))

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Predicted noise ``[B, d]`` of noisy images x ``[B, d]`` at diffusion times t ``[B]`` for labels y ``[B]``."""
        x = check_tensor(x, "x")
        if x.ndim != 2 or x.shape[1] != self.d or x.shape[0] == 0:
            raise ValueError(f"x must be a non-empty [B, d={self.d}] tensor, got shape {tuple(x.shape)}")
        for name, v, hi in (("t", t, self.n_steps), ("y", y, self.n_classes)):
            check_tensor(v, name, dtype="int", shape=(x.shape[0],))
            if int(v.min()) < 0 or int(v.max()) >= hi:
                raise ValueError(f"{name} must be in [0, {hi}), got range [{int(v.min())}, {int(v.max())}]")
        return self.head(self.mid(self.block(x, t, y)))


def _images_labels(model: DigitsDDPM, X: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
    X = check_tensor(X, "X")
    if X.ndim != 2 or X.shape[1] != model.d or X.shape[0] == 0:
        raise ValueError(
            f"X must be a non-empty [N, d={model.d}] tensor of images in [-1, 1], got {tuple(X.shape)}"
        )
    if float(X.abs().max()) > 1:
        raise ValueError(
            f"X must hold images scaled to [-1, 1], got range [{float(X.min()):.3g}, {float(X.max()):.3g}]"
        )
    y = check_tensor(y, "y", dtype="int", shape=(X.shape[0],))
    if int(y.min()) < 0 or int(y.max()) >= model.n_classes:
        raise ValueError(
            f"y must be labels in [0, {model.n_classes}), got range [{int(y.min())}, {int(y.max())}]"
        )
    return X.float(), y.long()


def train_ddpm(
    model: DigitsDDPM,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int = 4000,
    batch_size: int = 256,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool | None = None,
) -> list[float]:
    """Train ``model`` in place with the DDPM ε-prediction loss (Adam, cosine LR decay); returns the losses.

    Args:
        X: ``[N, d]`` images in [-1, 1]; y: ``[N]`` integer labels.
        steps, batch_size, lr: the budget.
        seed: batches, times and noise (a local generator).
    """
    if not isinstance(model, DigitsDDPM):
        raise TypeError(f"model must be a DigitsDDPM, got {type(model).__name__}")
    X, y = _images_labels(model, X, y)
    steps = check_int(steps, "steps", low=1)
    batch_size = check_int(batch_size, "batch_size", low=1)
    lr = check_float(lr, "lr", low=0.0, low_open=True)
    g = make_generator(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    model.train()
    with torch.enable_grad():
        losses = _ddpm_loop(model, X, y, steps, batch_size, opt, sched, g, progress)
    model.eval()
    return losses


def _ddpm_loop(
    model: DigitsDDPM, X: torch.Tensor, y: torch.Tensor, steps: int, batch_size: int, opt: Any, sched: Any,
    g: torch.Generator, progress: bool | None,
) -> list[float]:  # fmt: skip
    ab = model.alphas_cumprod
    losses = []
    for _ in progress_bar(range(steps), desc="DDPM", disable=None if progress is None else not progress):
        i = torch.randint(0, X.shape[0], (batch_size,), generator=g)
        t = torch.randint(0, model.n_steps, (batch_size,), generator=g)
        noise = torch.randn(batch_size, model.d, generator=g)
        a = ab[t][:, None]
        xt = a.sqrt() * X[i] + (1 - a).sqrt() * noise
        loss = F.mse_loss(model(xt, t, y[i]), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return losses


@torch.no_grad()
def ddpm_sample(
    model: DigitsDDPM,
    labels: torch.Tensor,
    *,
    seed: int = 0,
    hooks: Iterable[_BlockHook] = (),
) -> torch.Tensor:
    """Ancestral DDPM sampling (posterior variance σ_t² = β̃_t) of images ``[B, d]`` in [-1, 1] for integer ``labels`` ``[B]``.

    Step ``i = 0 … T−1`` denoises diffusion time ``T−1−i``; before each model call every hook in ``hooks``
    (:class:`ActivationCapture`, :class:`SAEUnlearningHook`, already attached) is set to step ``i``, and a hook
    whose ``n_steps`` differs from the model's T raises ``ValueError`` up front. ``seed`` drives the noise.
    """
    if not isinstance(model, DigitsDDPM):
        raise TypeError(f"model must be a DigitsDDPM, got {type(model).__name__}")
    labels = check_tensor(labels, "labels", dtype="int", ndim=1)
    if labels.numel() == 0:
        raise ValueError("labels must hold at least one label [B >= 1], got an empty tensor")
    if int(labels.min()) < 0 or int(labels.max()) >= model.n_classes:
        raise ValueError(
            f"labels must be in [0, {model.n_classes}), got range [{int(labels.min())}, {int(labels.max())}]"
        )
    hooks = list(hooks)
    for h in hooks:
        if not isinstance(h, _BlockHook):
            raise TypeError(
                f"hooks must be ActivationCapture/SAEUnlearningHook objects, got {type(h).__name__}"
            )
        h.check_steps(model.n_steps)
    g = make_generator(seed)
    B, T = labels.shape[0], model.n_steps
    y = labels.long()
    x = torch.randn(B, model.d, generator=g)
    betas, ab = model.betas, model.alphas_cumprod
    for i in range(T):
        t = T - 1 - i
        for h in hooks:
            h.set_step(i)
        eps = model(x, torch.full((B,), t, dtype=torch.long), y)
        mean = (x - betas[t] / (1 - ab[t]).sqrt() * eps) / (1 - betas[t]).sqrt()
        if t > 0:  # posterior variance β̃_t = β_t (1 − ᾱ_{t−1}) / (1 − ᾱ_t)
            var = betas[t] * (1 - ab[t - 1]) / (1 - ab[t])
            x = mean + var.sqrt() * torch.randn(B, model.d, generator=g)
        else:
            x = mean
    return x.clamp(-1, 1)
