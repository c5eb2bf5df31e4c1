"""scikit-learn's own estimator checks (``parametrize_with_checks``) on the package's estimators (issue 81).

Only declared, reasoned exceptions are expected to fail. ``epochs=10, lr=1e-2`` keeps the checks' dozens of
fits fast (scikit-learn's ``check_classifiers_train`` still needs accuracy > 0.83 on its blobs).
"""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

import icml25.generative_models as gm

PARTLY_NAN = (
    "by design: NaN marks a missing modality, so a modality's block must be all NaN or all finite in a row; "
    "this check (for allow_nan estimators) scatters single NaN entries, which fit rejects as a partly-NaN block"
)
EXPECTED_FAILED = {"check_estimators_pickle": PARTLY_NAN}


@parametrize_with_checks(
    [gm.CopulaFusionClassifier(epochs=10, lr=1e-2)], expected_failed_checks=lambda est: EXPECTED_FAILED
)
def test_sklearn_estimator_checks(estimator, check) -> None:
    check(estimator)
