"""The SAE training loop, one for every model of the zoo (MSAE's official recipe).

One loop for every model of the zoo, following the official MSAE ``train.py``:
``loss.backward()`` → rescale decoder rows to unit norm (compensating in the encoder) → remove the decoder
gradient component parallel to each row → clip the gradient norm (1.0) → AdamW step (betas (0.9, 0.999),
eps 6.25e-10, no weight decay). The learning rate is constant for the first 80% of the steps and decays
linearly to 0. The normalisation runs between ``backward()`` and ``step()`` for parity; it can be turned off.

Progress: a bar over the steps (on in a terminal, quiet in CI or captured output) and one INFO line per
phase on the ``icml25.interpretability.sae.training`` logger (start, LR decay, end), nothing per step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator

import torch

from icml25.interpretability.sae.base import SparseAutoencoder
from icml25.kernels.experiment import progress as progress_bar
from icml25.kernels.rng import make_generator

logger = logging.getLogger(__name__)
#: Seconds a ``progress=None`` training runs before its bar appears (short fits stay silent).
AUTO_PROGRESS_DELAY = 2.0


def _batches(
    data: torch.Tensor | Iterable[torch.Tensor], batch_size: int, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """Shuffled mini-batches of a tensor [N, d], epoch after epoch; or the items of an iterable as given."""
    if isinstance(data, torch.Tensor):
        n = data.shape[0]
        while True:
            perm = torch.randperm(n, generator=generator)
            for i in range(0, n, batch_size):
                yield data[perm[i : i + batch_size].to(data.device)]
    else:
        for item in data:
            if not isinstance(item, torch.Tensor):
                raise TypeError(f"data must yield torch.Tensor batches [B, d], got {type(item).__name__}")
            yield item


def train_sae(
    model: SparseAutoencoder,
    data: torch.Tensor | Iterable[torch.Tensor],
    *,
    steps: int | None = None,
    batch_size: int = 4096,
    lr: float | None = None,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 6.25e-10,
    weight_decay: float = 0.0,
    grad_clip: float | None = 1.0,
    decay_start: float = 0.8,
    normalize_decoder: bool = True,
    seed: int = 0,
    generator: torch.Generator | None = None,
    progress: bool | None = None,
    desc: str | None = None,
) -> dict[str, list[float]]:
    """Train ``model`` in place on activations and return the per-step logs.

    Args:
        model: any :class:`SparseAutoencoder` (its ``loss`` is minimised).
        data: a tensor [N, d_in] (shuffled mini-batches, cycling over epochs) or an iterable of batches
            [B, d_in] (consumed in order, e.g. a stream of activations).
        steps: optimiser steps. Required for a tensor; for an iterable ``None`` means "until exhausted" —
            then give ``steps`` anyway if you want the LR schedule to end at 0.
        batch_size: rows per step when ``data`` is a tensor.
        lr: AdamW learning rate; ``None`` uses the model family's paper default (``model.default_lr``).
        betas, eps, weight_decay: AdamW settings (MSAE: (0.9, 0.999), 6.25e-10, 0).
        grad_clip: max gradient norm (``None``: no clipping).
        decay_start: fraction of ``steps`` after which the LR decays linearly to 0.
        normalize_decoder: unit-norm decoder rows and projected decoder gradients at every step.
        seed: seeds the batch order (a local generator: the global random state is untouched).
        generator: a ``torch.Generator`` for the batch order instead of ``seed`` (advanced by the call).
        progress: ``True``/``False`` force the step bar on/off; ``None`` (default) shows it in a terminal
            (not in CI or captured output) once training has run :data:`AUTO_PROGRESS_DELAY` seconds.
        desc: the progress bar's label (default: the model's class name).

    Returns:
        ``{"loss": [...], "lr": [...], <model log keys>: [...]}``, one entry per step.
    """
    if not isinstance(model, SparseAutoencoder):
        raise TypeError(f"model must be a SparseAutoencoder, got {type(model).__name__}")
    is_tensor = isinstance(data, torch.Tensor)
    if is_tensor:
        model._flatten(data[:1], "data")  # shape/dtype check without scanning everything twice
        if steps is None:
            raise ValueError("steps must be given when data is a tensor [N, d_in], got None")
        if data.ndim != 2 or data.shape[0] == 0:
            raise ValueError(
                f"data must be a non-empty tensor [N, d_in={model.d_in}], got {tuple(data.shape)}"
            )
        # Checked up front (one scan): a NaN row met mid-training would fail after the model has changed.
        if not bool(torch.isfinite(data).all()):
            raise ValueError(
                f"data must be finite, got {int((~torch.isfinite(data)).sum())} NaN/Inf values in a tensor of "
                f"shape {tuple(data.shape)}"
            )
    elif not isinstance(data, Iterable):
        raise TypeError(
            f"data must be a tensor [N, d_in] or an iterable of batches, got {type(data).__name__}"
        )
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not (0.0 <= decay_start <= 1.0):
        raise ValueError(f"decay_start must be in [0, 1], got {decay_start!r}")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {type(progress).__name__} {progress!r}")
    lr = model.default_lr if lr is None else float(lr)
    if lr <= 0:
        raise ValueError(f"lr must be positive, got {lr}")
    gen = make_generator(seed, generator)  # the batch order's own generator (validates seed/generator)

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def schedule(step: int) -> float:
        if steps is None:
            return 1.0
        start = int(decay_start * steps)
        return 1.0 if step < start else max(0.0, (steps - step) / max(1, steps - start))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    logs: dict[str, list[float]] = {"loss": [], "lr": []}
    name = desc or type(model).__name__
    decay_step = None if steps is None or decay_start >= 1.0 else int(decay_start * steps)
    logger.info(
        "%s: training %s (d_in=%d, d_sae=%d) for %s steps, batch %s, lr %g",
        name, type(model).__name__, model.d_in, model.d_sae, steps if steps is not None else "all stream",
        batch_size if is_tensor else "as streamed", lr,
    )  # fmt: skip
    start_time = time.perf_counter()
    model.train()
    bar = progress_bar(
        total=steps,
        desc=name,
        **(
            {"disable": None, "delay": AUTO_PROGRESS_DELAY} if progress is None else {"disable": not progress}
        ),
    )
    for step, xb in enumerate(_batches(data, batch_size, gen)):
        if steps is not None and step >= steps:
            break
        if step == decay_step and step > 0:
            logger.info(
                "%s: step %d, loss %.4g: linear LR decay to 0 from here", name, step, logs["loss"][-1]
            )
        opt.zero_grad(set_to_none=True)
        loss, info = model.loss(xb)
        loss.backward()
        if normalize_decoder:
            model.normalize_decoder_()
            model.project_decoder_grad_()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        logs["lr"].append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        logs["loss"].append(float(loss.detach()))
        for key, value in info.items():
            logs.setdefault(key, []).append(value)
        bar.update(1)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{float(loss.detach()):.4f}", refresh=False)
    bar.close()
    if normalize_decoder:
        model.normalize_decoder_()  # leave the model with unit-norm decoder rows
    model.eval()
    n_steps = len(logs["loss"])
    epochs = f", {n_steps * batch_size / data.shape[0]:.3g} epochs" if is_tensor else ""
    logger.info(
        "%s: done, %d steps%s, final loss %s, %.1f s", name, n_steps, epochs,
        f"{logs['loss'][-1]:.4g}" if n_steps else "n/a", time.perf_counter() - start_time,
    )  # fmt: skip
    return logs
