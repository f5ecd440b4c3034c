"""Small deterministic models for raypipe's sample graphs (samples/graphs/*.yaml).

Plain classes (no Ray import): the graph runtime wraps each in a Serve deployment named after
its node. Every answer is a pure function of the input, so the samples' responses can be
predicted (see samples/graphs/README.md):

- Preprocess: {"text": "  I LOVE  this "} -> {"text": "i love this", "words": 3}
  (whitespace collapsed; lower-cased unless lowercase=False). A bare string works as input too.
- Classifier(label): scores the words of the text. score = 0.5 + 0.5 * (positive - negative) /
  words, rounded to 4 places (0.5 for no words), with the sentiment word lists below; the
  output is {"label": label, "score": score, "positive": score >= threshold}. `threshold` is 0.5
  unless the deployment's user_config sets it. A text containing "fail:<label>" makes that
  classifier raise (to show a node failing), e.g. "fail:b". For rollout demos and tests it can
  be made broken: `fail_at_start` (raises in its constructor), `error_share` (that share of
  calls fail, deterministically) and `delay_ms` (each call sleeps that long).
- Combine: {"a": {...score...}, "b": {...}} -> {"score": mean of the scores, "votes": {name:
  score}}; parts that are missing (a skipped optional branch) simply do not vote.
- Audit: records what it saw: {"audited": true, "fields": [sorted keys of the request]}.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

POSITIVE = frozenset({"good", "great", "love", "excellent", "happy", "nice", "fast"})
NEGATIVE = frozenset({"bad", "terrible", "hate", "awful", "sad", "slow", "broken"})


def _text_of(payload) -> str:
    if isinstance(payload, str):
        return payload
    if isinstance(payload, dict) and isinstance(payload.get("text"), str):
        return payload["text"]
    return ""


class Preprocess:
    def __init__(self, lowercase: bool = True):
        self.lowercase = lowercase

    def __call__(self, payload) -> dict:
        text = " ".join(_text_of(payload).split())
        if self.lowercase:
            text = text.lower()
        return {"text": text, "words": len(text.split())}


def score_text(text: str) -> float:
    words = [w.strip(".,!?;:\"'()").lower() for w in text.split()]
    words = [w for w in words if w]
    if not words:
        return 0.5
    positive = sum(w in POSITIVE for w in words)
    negative = sum(w in NEGATIVE for w in words)
    return round(0.5 + 0.5 * (positive - negative) / len(words), 4)


class Classifier:
    def __init__(self, label: str = "model", threshold: float = 0.5, fail_at_start: bool = False,
                 error_share: float = 0.0, delay_ms: float = 0.0):
        # The last three make the broken versions a canary rollout must catch (samples/graphs/
        # README.md): a model that cannot start, one that fails a share of its requests, and
        # one that is slow.
        if fail_at_start:
            raise RuntimeError(f"classifier {label} cannot start: its weights are missing")
        self.label = label
        self.threshold = threshold
        self.error_share = max(0.0, min(1.0, float(error_share)))
        self.delay_s = max(0.0, float(delay_ms)) / 1000.0
        self.calls = 0

    def reconfigure(self, user_config: dict) -> None:
        # The Serve config's user_config (e.g. {"threshold": 0.5}) arrives here, live.
        self.threshold = float(user_config.get("threshold", self.threshold))

    def __call__(self, payload) -> dict:
        text = _text_of(payload)
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        # Deterministic: the first round(share * 10) of every 10 calls fail.
        if (self.calls - 1) % 10 < round(self.error_share * 10):
            raise RuntimeError(f"classifier {self.label} failed (error_share {self.error_share})")
        if f"fail:{self.label}".lower() in text.lower():
            raise ValueError(f"classifier {self.label} was asked to fail")
        score = score_text(text)
        return {"label": self.label, "score": score, "positive": score >= self.threshold}


class Combine:
    def __call__(self, parts) -> dict:
        votes = {
            name: part["score"]
            for name, part in sorted((parts or {}).items())
            if isinstance(part, dict) and isinstance(part.get("score"), (int, float))
        }
        score = round(sum(votes.values()) / len(votes), 4) if votes else None
        return {"score": score, "votes": votes}


class Audit:
    def __call__(self, payload) -> dict:
        fields = sorted(payload) if isinstance(payload, dict) else []
        logger.info("audit: request with fields %s", fields)
        return {"audited": True, "fields": fields}
