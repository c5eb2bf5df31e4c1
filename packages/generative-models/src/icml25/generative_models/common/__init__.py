"""What several generative-model papers share: public modules named for what they hold.

* :mod:`~icml25.generative_models.common.schedules`: the VP and EDM diffusion SDEs and their time grids.
* :mod:`~icml25.generative_models.common.mixtures`: :class:`GaussianMixture`, the exact diffused-mixture oracle.
* :mod:`~icml25.generative_models.common.metrics`: sample-quality metrics (sliced Wasserstein, HF energy).
* :mod:`~icml25.generative_models.common.vit_mae`: :func:`small_vit_mae` and :func:`load_vit_mae`, the
  ``transformers`` image MAEs of the vision-model forecasters (VisionTS, P25, and VIMTS, P35).

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
    from icml25.generative_models.common.vit_mae import load_vit_mae, small_vit_mae
else:
    __getattr__, __dir__ = lazy_namespace(__name__, __file__)

__all__ = [
    "EDMSchedule",
    "GaussianMixture",
    "Schedule",
    "VPSchedule",
    "high_freq_energy",
    "load_vit_mae",
    "sliced_wasserstein",
    "small_vit_mae",
    "time_grid",
]
