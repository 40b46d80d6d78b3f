"""The offline toxicity classifier (alt-profanity-check), loaded on first use, once per process."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

Predict = Callable[[list[str]], Any]

# Texts the fast path must score exactly as the library does before it is trusted.
_PROBES = [
    "",
    "Thanks, the report looks good.",
    "You are a stupid idiot",
    "what the hell",
    "This is a damn good sandwich",
    "I have 3 apples and 2024 was good",
]


@functools.cache
def _predict() -> Predict:
    # Importing profanity_check unpickles its model (about a second): done on first use, once
    # per process (the import lock keeps concurrent first calls from loading it twice).
    from profanity_check import profanity_check as library

    return _linear(library.vectorizer, library.model, library.predict_prob) or library.predict_prob


def _linear(vectorizer: Any, model: Any, reference: Predict) -> Predict | None:
    """Return the model as one matrix product, or None where that does not reproduce it.

    The model is TF-IDF, then five sigmoid-calibrated linear SVMs averaged. scikit-learn's
    predict_proba validates its input at every step, about 2.5 ms a call, most of it
    overhead; one product of the same weights takes a tenth of that, and a stream scores each
    sentence as it ends. Any other shape of model (a new release) keeps the library's call.
    """
    import numpy as np

    try:
        parts = model.calibrated_classifiers_
        if any(p.method != "sigmoid" or list(p.classes) != [0, 1] for p in parts):
            return None
        weights = np.vstack([p.estimator.coef_.ravel() for p in parts]).T
        intercepts = np.array([p.estimator.intercept_[0] for p in parts])
        slopes = np.array([p.calibrators[0].a_ for p in parts])
        offsets = np.array([p.calibrators[0].b_ for p in parts])
    except (AttributeError, IndexError, TypeError):
        return None

    def predict(texts: list[str]) -> Any:
        decisions = np.asarray(vectorizer.transform(texts) @ weights) + intercepts
        return (1.0 / (1.0 + np.exp(slopes * decisions + offsets))).mean(axis=1)

    if not np.allclose(predict(_PROBES), reference(_PROBES), rtol=0, atol=1e-9):
        return None
    return predict


def toxicity_scores(texts: Sequence[str]) -> list[float]:
    """Return the probability that each text is toxic, in one call to the classifier."""
    if not texts:
        return []
    return [float(p) for p in _predict()(list(texts))]
