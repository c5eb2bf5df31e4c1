"""The report every paper experiment returns (``run(quick, seed) -> Report``).

It lives in ``icml25-kernels`` because that is the one distribution every area package depends on; the
``icml25 reproduce`` command reads it by attribute only, so any object with these fields works too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from icml25.kernels.experiment import Check


BETTER = ("higher", "lower")


@dataclass
class Report:
    """Outcome of one small-scale reproduction.

    Attributes:
        paper: catalog id, e.g. ``"P07"``.
        claim: the paper's central claim, one sentence.
        threshold: the rule checked, in words (e.g. ``"speedup >= 5x and F1 >= baseline - 0.02"``).
        passed: whether the measured numbers satisfy the rule.
        metrics: every measured number, the baseline's included (``baseline_`` prefix by convention).
        headline: key of ``metrics`` shown in the one-line summary.
        baseline: key of ``metrics`` holding the baseline's value of the headline metric, if any.
        figures: PNG files written by the experiment.
        notes: anything a reader needs to interpret the numbers (scale, deviations from the paper).
        checks: the pass rule as named conditions (``{"GAS success > flat baseline": True, ...}``);
            when given, ``passed`` must equal ``all(checks.values())``, and the reproduce command and the
            results ledger show which condition failed.
        seeds: the seeds the numbers aggregate over (empty: the one ``seed`` passed to ``run``).
        preconditions: named conditions under which the comparison can show the effect at all (the
            baseline learned the task, a regulariser's baseline overfits...). When one fails the run is
            *inconclusive* (:attr:`inconclusive`): ``icml25 reproduce`` reports INCONCLUSIVE and never
            records it as a pass or a miss; the setting has to change.
        better: ``"higher"`` or ``"lower"``: which direction of the headline metric is better (the result
            line's ↑/↓). ``None`` (the default) infers it from the headline's name (:func:`direction`).
    """

    paper: str
    claim: str
    threshold: str
    passed: bool
    metrics: dict[str, float]
    headline: str
    baseline: str | None = None
    figures: list[Path] = field(default_factory=list)
    notes: str = ""
    checks: dict[str, bool] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    preconditions: dict[str, bool] = field(default_factory=dict)
    better: str | None = None

    def __post_init__(self) -> None:
        if self.better not in (None, *BETTER):
            raise ValueError(f"better must be one of {BETTER} or None, got {self.better!r}")
        if self.headline not in self.metrics:
            raise ValueError(
                f"headline must be a key of metrics {sorted(self.metrics)}, got {self.headline!r}"
            )
        if self.baseline is not None and self.baseline not in self.metrics:
            raise ValueError(
                f"baseline must be a key of metrics {sorted(self.metrics)}, got {self.baseline!r}"
            )
        for key, value in self.metrics.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"metrics[{key!r}] must be a float, got {type(value).__name__}")
            self.metrics[key] = float(value)
        self.passed = bool(self.passed)
        self.checks = {str(name): bool(ok) for name, ok in self.checks.items()}
        self.preconditions = {str(name): bool(ok) for name, ok in self.preconditions.items()}
        if self.checks and self.passed != all(self.checks.values()):
            failed = [name for name, ok in self.checks.items() if not ok]
            raise ValueError(
                f"passed={self.passed} contradicts checks (failed: {failed or 'none'}); "
                "passed must equal all(checks.values())"
            )
        self.figures = [Path(f) for f in self.figures]
        self.seeds = [int(s) for s in self.seeds]

    @classmethod
    def from_checks(
        cls,
        *,
        paper: str,
        claim: str,
        checks: Sequence[Check],
        metrics: Mapping[str, float],
        headline: str,
        baseline: str | None = None,
        preconditions: Sequence[Check] = (),
        **kwargs: Any,
    ) -> Report:
        """A report whose threshold text and verdict are both built from one list of named checks;
        ``preconditions`` (named checks on the same metrics) decide whether the run is conclusive."""
        from icml25.kernels.experiment import evaluate_checks, threshold_text

        results = evaluate_checks(checks, metrics)
        return cls(
            paper=paper,
            claim=claim,
            threshold=threshold_text(checks),
            passed=all(results.values()),
            metrics=dict(metrics),
            headline=headline,
            baseline=baseline,
            checks=results,
            preconditions=evaluate_checks(preconditions, metrics) if preconditions else {},
            **kwargs,
        )

    @property
    def inconclusive(self) -> bool:
        """Whether a precondition failed: the run cannot tell whether the claim holds."""
        return not all(self.preconditions.values())

    @property
    def failed_preconditions(self) -> list[str]:
        """Names of the preconditions that did not hold."""
        return [name for name, ok in self.preconditions.items() if not ok]

    @property
    def failed_checks(self) -> list[str]:
        """Names of the checks that did not hold (empty when all hold or none were given)."""
        return [name for name, ok in self.checks.items() if not ok]

    def summary(self) -> str:
        """``<headline>=<value> (baseline <value>, threshold <rule>)``."""
        return summary_line(self)


def format_value(x: float) -> str:
    """A metric as the report line shows it: 4 significant digits; ``nan``/``inf`` spelled out."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.4g}"


def summary_line(report: Any) -> str:
    """``<headline>=<value> (baseline <value>, threshold <rule>)`` of any object with Report's fields.

    The one formatter of the report line: :meth:`Report.summary` and the reproduce command both use it.
    """
    metrics = report.metrics
    base = "n/a" if report.baseline is None else format_value(metrics[report.baseline])
    head = f"{report.headline}={format_value(metrics[report.headline])}"
    return f"{head} (baseline {base}, threshold {report.threshold})"


# Words of a metric's name that say which direction is better, matched against its ``_``-separated parts
# (``baseline_flat_success`` -> higher, ``k2vae_crps`` -> lower). Lower wins when both occur
# (``acc_error``); a name with neither has no direction unless the report states ``better``.
_LOWER = frozenset(
    "err error errors mse rmse mae crps loss nll kl bpd asr l1 dist distance mmd swd fvu gap regret amr "
    "dlog rmsd cost time seconds".split()
)
_HIGHER = frozenset(
    "acc accuracy success auroc f1 psnr stability stable ap em score recall precision iou miou "
    "match reward return lipsync rc ua probe speedup separation drop exact".split()
)


def direction(report: Any) -> str | None:
    """``"higher"``, ``"lower"`` or ``None``: which direction of ``report.headline`` is better.

    The report's own ``better`` when it states one, else inferred from the headline's name: a part such as
    ``error``, ``mse``, ``crps``, ``loss`` means lower is better; ``accuracy``, ``success``, ``auroc``, ``f1``
    higher (an ``auc`` of an error curve, like other names, says nothing by itself: state ``better``).
    """
    better = getattr(report, "better", None)
    if better in BETTER:
        return str(better)
    parts = set(str(report.headline).lower().replace("-", "_").split("_"))
    if parts & _LOWER:
        return "lower"
    if parts & _HIGHER:
        return "higher"
    return None


ARROWS = {"higher": "↑", "lower": "↓"}


def short_line(report: Any, width: int = 120) -> str:
    """``<headline>=<value> ↑ (baseline <value>)``: the headline, which direction is better, and the
    baseline's value, without the threshold (``REPORT.md`` has it in full), at most ``width`` characters."""
    metrics = report.metrics
    arrow = ARROWS.get(direction(report) or "", "")
    head = f"{report.headline}={format_value(metrics[report.headline])}" + (f" {arrow}" if arrow else "")
    if report.baseline is not None:
        head += f" (baseline {format_value(metrics[report.baseline])})"
    return clip(head, width)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``…`` when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"
