"""The area roots are lazy namespaces (icml25.kernels.lazy): importing one imports no paper module, a broken
paper module breaks only its own names, and the results ledger's source closures are the ones the eager roots
gave (icml25.kernels.provenance reads the roots' TYPE_CHECKING imports)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AREAS

from icml25.kernels import provenance
from icml25.kernels.lazy import lazy_exports

# the one eager import of a root, and why: importing icml25.rl registers the grid mazes with gymnasium
EAGER = {"rl": {"icml25.rl.maze"}}
# per area, a paper module that no other library module imports: broken on purpose in a fresh interpreter
BROKEN = {
    "causal-discovery": "icml25.causal_discovery.tfl",
    "federated": "icml25.federated.cl_peft_select",
    "generative-models": "icml25.generative_models.playmate_training",
    "interpretability": "icml25.interpretability.task_vectors",
    "llm-efficiency": "icml25.llm_efficiency.sparge",
    "rl": "icml25.rl.sable",
}

# Runs in a fresh interpreter: a meta-path finder makes BROKEN fail to import, then the root is imported and
# every name of __all__ is looked up. Prints what was loaded and which names failed, as JSON.
SCRIPT = """
import importlib, json, sys

package, broken = sys.argv[1], sys.argv[2]


class Break:
    def find_spec(self, name, path=None, target=None):
        if name == broken:
            raise ImportError(f"{name} is broken on purpose")
        return None


sys.meta_path.insert(0, Break())
root = importlib.import_module(package)
loaded = sorted(m for m in sys.modules if m.startswith(package + "."))
failed = {}
for name in root.__all__:
    try:
        getattr(root, name)
    except ImportError as err:
        failed[name] = str(err)
print(json.dumps({"loaded": loaded, "failed": sorted(failed), "messages": sorted(set(failed.values()))}))
"""


def _package(area: str) -> str:
    return "icml25." + area.replace("-", "_")


def _exports(area: str) -> dict[str, tuple[str, str]]:
    spec = importlib.util.find_spec(_package(area))
    assert spec is not None and spec.origin
    return lazy_exports(Path(spec.origin).read_bytes(), _package(area))


def test_every_area_is_covered() -> None:
    assert set(BROKEN) == set(AREAS)


@pytest.mark.parametrize("area", AREAS)
def test_importing_the_area_imports_no_paper_module_and_a_broken_one_breaks_only_its_names(area: str) -> None:
    package = _package(area)
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, package, BROKEN[area]], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    own = sorted(name for name, (module, _) in _exports(area).items() if module == BROKEN[area])
    assert own, f"{BROKEN[area]} binds no name of {package}"
    assert result["failed"] == sorted(set(own) & set(importlib.import_module(package).__all__))
    assert result["messages"] == [f"{BROKEN[area]} is broken on purpose"]
    # the import itself (the broken module's finder changes nothing there) loaded no module of the area but
    # its declared eager one
    assert result["loaded"] == sorted(EAGER.get(area, set()))


@pytest.mark.parametrize("area", AREAS)
def test_the_lazy_map_covers_all_and_no_name_is_shadowed_by_a_submodule(area: str) -> None:
    root = importlib.import_module(_package(area))
    exports = _exports(area)
    eager = {name for name in vars(root) if not name.startswith("__")} - set(exports)
    assert sorted(set(root.__all__) - set(exports) - eager - {"__version__"}) == []
    # importing a submodule binds its name in the package: a lazy name equal to it would be shadowed
    submodules = {info.name for info in pkgutil.iter_modules(root.__path__)}
    assert sorted(submodules & set(exports)) == []
    assert set(exports) <= set(dir(root))


# Closures of papers that import their area's common modules, another paper's module (until issue 82 moves
# it), a subpackage and an optional integration (recorded with the eager roots, before the roots became lazy;
# P30 and P49 since their shared code moved to generative_models/common, whose map also names vit_mae).
CLOSURES = {
    "icml25.rl.experiments.gas": [  # P05
        "icml25.kernels.rng", "icml25.kernels.serialization", "icml25.rl.datasets", "icml25.rl.experiments",
        "icml25.rl.experiments.gas", "icml25.rl.gas", "icml25.rl.gas.agent", "icml25.rl.gas.graph",
        "icml25.rl.gas.policy", "icml25.rl.gas.tdr", "icml25.rl.maze",
    ],
    "icml25.generative_models.experiments.bilevel_diffusion": [  # P30 (issue 82: common modules, no P49)
        "icml25.generative_models.bilevel", "icml25.generative_models.common",
        "icml25.generative_models.common.metrics", "icml25.generative_models.common.mixtures",
        "icml25.generative_models.common.schedules", "icml25.generative_models.common.vit_mae",
        "icml25.generative_models.experiments", "icml25.generative_models.experiments.bilevel_diffusion",
        "icml25.kernels.optim", "icml25.kernels.rng",
    ],
    "icml25.generative_models.experiments.density_guidance": [  # P49 (issue 82: common modules, no P33)
        "icml25.generative_models.common", "icml25.generative_models.common.metrics",
        "icml25.generative_models.common.mixtures", "icml25.generative_models.common.schedules",
        "icml25.generative_models.common.vit_mae", "icml25.generative_models.density_guidance",
        "icml25.generative_models.experiments",
        "icml25.generative_models.experiments.density_guidance", "icml25.kernels.rng",
    ],
    "icml25.federated.experiments.fedceo": [  # P50 (issue 82: the shared server step in federated.aggregation)
        "icml25.federated.aggregation", "icml25.federated.data", "icml25.federated.dp", "icml25.federated.experiments",
        "icml25.federated.experiments.fedceo", "icml25.federated.fedceo", "icml25.federated.server",
        "icml25.federated.training", "icml25.kernels.datasets", "icml25.kernels.optim", "icml25.kernels.rng",
    ],
    "icml25.interpretability.experiments.deception_probes": [  # P52
        "icml25.interpretability.deception_probes", "icml25.interpretability.deception_probes.data",
        "icml25.interpretability.deception_probes.hf", "icml25.interpretability.deception_probes.probes",
        "icml25.interpretability.deception_probes.scoring",
        "icml25.interpretability.deception_probes.synthetic", "icml25.interpretability.experiments",
        "icml25.interpretability.experiments.deception_probes",
    ],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(CLOSURES))
def test_source_closures_are_the_ones_the_eager_roots_gave(module: str) -> None:
    assert sorted(provenance.source_closure(module, provenance.find_installed)) == CLOSURES[module]
