"""The installed distribution's public API: every exported name resolves; versions agree."""

from importlib.metadata import version

import icml25.causal_discovery as package


def test_every_exported_name_resolves() -> None:
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert missing == []


def test_version_matches_distribution_metadata() -> None:
    assert package.__version__ == version("icml25-causal-discovery")
