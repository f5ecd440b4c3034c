"""Two model families trained on scikit-learn's bundled digits data (8x8 images of
handwritten digits, 1,797 of them) by `samples/digits/train.py`, served here with numpy only:
the Ray image needs no scikit-learn. The trained parameters travel in `weights.json`, inside
the code layer, so the graph, the code and the weights are one signed artifact.

- Logistic: multinomial logistic regression, softmax(x W + b).
- Discriminant: linear discriminant analysis (a generative model: Gaussian classes sharing one
  covariance), softmax(x W + b) of its discriminant functions.
- Vote: averages the two probability vectors; the digit is the most probable class.

Input: {"pixels": [64 numbers, 0..16]} (the data set's own scale). Each model answers
{"probabilities": [10 floats]}; Vote answers {"digit": d, "probabilities": [...], "models": n}.
"""

from __future__ import annotations

import json
import os

import numpy as np

_WEIGHTS = os.path.join(os.path.dirname(__file__), "weights.json")


def _load() -> dict:
    with open(_WEIGHTS, encoding="utf-8") as f:
        return json.load(f)


def _pixels(payload) -> np.ndarray:
    pixels = payload.get("pixels") if isinstance(payload, dict) else None
    if not isinstance(pixels, list) or len(pixels) != 64:
        raise ValueError("expected {'pixels': [64 numbers]}")
    return np.asarray(pixels, dtype=np.float64)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


class Logistic:
    def __init__(self):
        w = _load()["logistic"]
        self.coef = np.asarray(w["coef"])  # (10, 64)
        self.intercept = np.asarray(w["intercept"])  # (10,)
        self.mean = np.asarray(w["mean"])
        self.scale = np.asarray(w["scale"])

    def __call__(self, payload) -> dict:
        x = (_pixels(payload) - self.mean) / self.scale
        return {"probabilities": _softmax(self.coef @ x + self.intercept).round(6).tolist()}


class Discriminant:
    def __init__(self):
        w = _load()["discriminant"]
        self.coef = np.asarray(w["coef"])  # (10, 64)
        self.intercept = np.asarray(w["intercept"])  # (10,)

    def __call__(self, payload) -> dict:
        x = _pixels(payload)
        return {"probabilities": _softmax(self.coef @ x + self.intercept).round(6).tolist()}


class Vote:
    def __call__(self, parts) -> dict:
        votes = [
            np.asarray(part["probabilities"])
            for _, part in sorted((parts or {}).items())
            if isinstance(part, dict) and "probabilities" in part
        ]
        if not votes:
            raise ValueError("no model answered")
        mean = np.mean(votes, axis=0)
        return {"digit": int(mean.argmax()), "probabilities": mean.round(6).tolist(), "models": len(votes)}
