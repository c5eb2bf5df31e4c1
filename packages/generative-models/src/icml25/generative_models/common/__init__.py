"""What several generative-model papers share: public modules named for what they hold.

* :mod:`~icml25.generative_models.common.schedules`: the VP and EDM diffusion SDEs and their time grids.
* :mod:`~icml25.generative_models.common.mixtures`: :class:`GaussianMixture`, the exact diffused-mixture oracle.
* :mod:`~icml25.generative_models.common.metrics`: sample-quality metrics (sliced Wasserstein, HF energy).

A paper's module imports only its own files, these common modules and :mod:`icml25.kernels`, never another
paper's module; the names are re-exported here and by :mod:`icml25.generative_models`, lazily
(:mod:`icml25.kernels.lazy`).
"""

from typing import TYPE_CHECKING

from icml25.kernels.lazy import lazy_namespace

if TYPE_CHECKING:  # the name -> module map of the lazy namespace (icml25.kernels.lazy)
    from icml25.generative_models.common.metrics import high_freq_energy, sliced_wasserstein
    from icml25.generative_models.common.mixtures import GaussianMixture
    from icml25.generative_models.common.schedules import EDMSchedule, Schedule, VPSchedule, time_grid
else:
    __getattr__, __dir__ = lazy_namespace(__name__, __file__)

__all__ = [
    "EDMSchedule",
    "GaussianMixture",
    "Schedule",
    "VPSchedule",
    "high_freq_energy",
    "sliced_wasserstein",
    "time_grid",
]
