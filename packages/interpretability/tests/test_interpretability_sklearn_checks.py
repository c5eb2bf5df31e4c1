"""scikit-learn's own estimator checks (``parametrize_with_checks``) on the package's estimators (issue 81).

Only declared, reasoned exceptions are expected to fail (``EXPECTED_FAILED``).
"""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

import icml25.interpretability as ip

CONTROL_LABEL = (
    "by design: the deception probes' label convention reserves -1 for control (Alpaca) dialogues, which are "
    "never training data, so fit rejects the labels {-1, 1} this check uses"
)
EXPECTED_FAILED = {"check_classifiers_classes": CONTROL_LABEL}
ESTIMATORS = [ip.LogisticProbe(), ip.MeanDiffProbe(), ip.LATProbe(seed=0), ip.LDAProbe()]


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=lambda est: EXPECTED_FAILED)
def test_sklearn_estimator_checks(estimator, check) -> None:
    check(estimator)
