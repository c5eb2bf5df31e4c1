"""The installed distribution's public API: every exported name resolves; versions agree."""

from importlib.metadata import version

import icml25.kernels as package


def test_every_exported_name_resolves() -> None:
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert missing == []


def test_version_matches_distribution_metadata() -> None:
    assert package.__version__ == version("icml25-kernels")


def test_nn_match_family_exports_resolve() -> None:
    import icml25.kernels.nn_match as family

    assert [name for name in family.__all__ if not hasattr(family, name)] == []


def test_retention_family_exports_resolve() -> None:
    import icml25.kernels.retention as family

    assert [name for name in family.__all__ if not hasattr(family, name)] == []


def test_selective_scan_family_exports_resolve() -> None:
    import icml25.kernels.selective_scan as family

    assert [name for name in family.__all__ if not hasattr(family, name)] == []


def test_token_merge_family_exports_resolve() -> None:
    import icml25.kernels.token_merge as family

    assert [name for name in family.__all__ if not hasattr(family, name)] == []
