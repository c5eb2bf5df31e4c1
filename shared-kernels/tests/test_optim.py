"""icml25.kernels.optim.Adam: the update of torch.optim.Adam, a closed-form first step, ascent, bad input."""

from __future__ import annotations

import pytest
import torch

from icml25.kernels.optim import Adam
from icml25.kernels.rng import isolated_rng


def _mlp(seed: int) -> torch.nn.Module:
    with isolated_rng(seed):
        return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def test_first_step_closed_form() -> None:
    """Step 1 moves every parameter by -lr·g/(|g| + eps): the bias correction is exact."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    p.grad = torch.tensor([0.5, -4.0, 1e-3])
    Adam([p], lr=0.1).step()
    g = torch.tensor([0.5, -4.0, 1e-3])
    assert torch.allclose(p.detach(), torch.tensor([1.0, -2.0, 3.0]) - 0.1 * g / (g.abs() + 1e-8), atol=1e-6)


@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_matches_torch_optim(maximize: bool, weight_decay: float) -> None:
    a, b = _mlp(0), _mlp(0)
    ours = Adam(a.parameters(), lr=0.01, weight_decay=weight_decay, maximize=maximize)
    ref = torch.optim.Adam(b.parameters(), lr=0.01, weight_decay=weight_decay, maximize=maximize)
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
    for _ in range(20):
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_explicit_grads_equal_grad_fields() -> None:
    """step(grads) from torch.autograd.grad is the same update as step() from .grad; None skips a tensor."""
    a, b = _mlp(1), _mlp(1)
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    opt_a, opt_b = Adam(a.parameters(), lr=0.05), Adam(b.parameters(), lr=0.05)
    for _ in range(5):
        opt_a.zero_grad()
        a(x).sum().backward()
        opt_a.step()
        opt_b.step(torch.autograd.grad(b(x).sum(), list(b.parameters())))
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters()))
    frozen = b[0].weight.detach().clone()
    opt_b.step([None, *torch.autograd.grad(b(x).sum(), list(b.parameters())[1:])])
    assert torch.equal(b[0].weight, frozen)


def test_maximize_ascends_a_concave_objective() -> None:
    x = torch.tensor([3.0, -1.0], requires_grad=True)
    opt = Adam([x], lr=0.1, maximize=True)
    for _ in range(300):
        opt.step(torch.autograd.grad(-(x - 0.5).pow(2).sum(), [x]))
    assert torch.allclose(x.detach(), torch.tensor([0.5, 0.5]), atol=1e-2)


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"lr": 0.0}, ValueError, "lr"),
        ({"lr": float("nan")}, ValueError, "lr"),
        ({"lr": "0.1"}, TypeError, "lr"),
        ({"betas": (0.9, 1.0)}, ValueError, "betas[1]"),
        ({"betas": (-0.1, 0.999)}, ValueError, "betas[0]"),
        ({"betas": 0.9}, TypeError, "betas"),
        ({"eps": 0.0}, ValueError, "eps"),
        ({"weight_decay": -1e-3}, ValueError, "weight_decay"),
        ({"maximize": 1}, TypeError, "maximize"),
    ],
)
def test_bad_hyperparameters_name_the_argument(kwargs: dict, error: type, names: str) -> None:
    with pytest.raises(error, match=names.replace("[", r"\[").replace("]", r"\]")):
        Adam([torch.zeros(2, requires_grad=True)], **kwargs)


def test_bad_params_and_grads_name_the_argument() -> None:
    with pytest.raises(TypeError, match="params"):
        Adam(torch.zeros(2, requires_grad=True))
    with pytest.raises(TypeError, match="params"):
        Adam([1.0])
    opt = Adam([torch.zeros(2, requires_grad=True)])
    with pytest.raises(ValueError, match="grads"):
        opt.step([torch.zeros(2), torch.zeros(2)])
    with pytest.raises(ValueError, match=r"grads\[0\]"):
        opt.step([torch.zeros(3)])
    assert opt.t == 0  # a rejected step changes nothing
