"""Trains the digits sample's two models at push time and writes their parameters into the
package (`digits_models/weights.json`), and a held-out set to check the served pipeline with.

    python samples/digits/train.py [--out DIR] [--seed N]

Needs scikit-learn (its bundled digits data set: nothing is downloaded). DIR (default: this
directory) gets `digits_models/` (the package, copied, with weights.json) and `holdout.json`
({"pixels": [[64]...], "labels": [...]}, 25 % of the data, never trained on). Prints the
held-out accuracy of each model and of their vote, computed here the way the served models
compute it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np
from sklearn.datasets import load_digits
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=HERE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.25, random_state=args.seed, stratify=digits.target
    )
    scaler = StandardScaler().fit(x_train)
    # A constant pixel has no scale; dividing by 1 leaves it at 0, as sklearn does.
    scale = np.where(scaler.scale_ == 0, 1.0, scaler.scale_)
    logistic = LogisticRegression(max_iter=2000).fit(scaler.transform(x_train), y_train)
    discriminant = LinearDiscriminantAnalysis().fit(x_train, y_train)

    weights = {
        "logistic": {
            "coef": logistic.coef_.round(8).tolist(),
            "intercept": logistic.intercept_.round(8).tolist(),
            "mean": scaler.mean_.round(8).tolist(),
            "scale": scale.round(8).tolist(),
        },
        "discriminant": {
            "coef": discriminant.coef_.round(8).tolist(),
            "intercept": discriminant.intercept_.round(8).tolist(),
        },
    }
    package = os.path.join(args.out, "digits_models")
    if os.path.abspath(package) != os.path.join(HERE, "digits_models"):
        shutil.copytree(os.path.join(HERE, "digits_models"), package, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "weights.json"))
    with open(os.path.join(package, "weights.json"), "w", encoding="utf-8") as f:
        json.dump(weights, f, sort_keys=True, separators=(",", ":"))
    with open(os.path.join(args.out, "holdout.json"), "w", encoding="utf-8") as f:
        json.dump({"pixels": x_test.tolist(), "labels": y_test.tolist()}, f)

    import sys
    sys.path.insert(0, args.out)
    from digits_models.models import Discriminant, Logistic, Vote  # the served code, as Ray runs it

    lg, ld, vote = Logistic(), Discriminant(), Vote()
    hits = {"logistic": 0, "discriminant": 0, "vote": 0}
    for pixels, label in zip(x_test.tolist(), y_test.tolist()):
        a, b = lg({"pixels": pixels}), ld({"pixels": pixels})
        hits["logistic"] += int(np.argmax(a["probabilities"]) == label)
        hits["discriminant"] += int(np.argmax(b["probabilities"]) == label)
        hits["vote"] += int(vote({"a": a, "b": b})["digit"] == label)
    n = len(y_test)
    print(json.dumps({name: round(h / n, 4) for name, h in hits.items()} | {"holdout": n}))


if __name__ == "__main__":
    main()
