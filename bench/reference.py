"""The yardstick every bench prints: raw Ed25519 signs per second on one core in the same run
(``cryptography``, a 300-byte message), and costs expressed in those signs. Machines here differ
2-2.5x from day to day; a cost in signs does not."""

from __future__ import annotations

import time

from cryptography.hazmat.primitives.asymmetric import ed25519

__all__ = ["in_signs", "sign_rate"]


def sign_rate(seconds: float = 1.0) -> float:
    """Raw Ed25519 signs/s on one core, best of three rounds (the machine's speed drifts)."""
    key = ed25519.Ed25519PrivateKey.generate()
    message = b"x" * 300
    best = 0.0
    for _ in range(3):
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            for _ in range(200):
                key.sign(message)
            done += 200
        best = max(best, done / (time.perf_counter() - start))
    return best


def in_signs(seconds: float, signs_per_second: float) -> float:
    """``seconds`` of CPU as a number of raw signatures."""
    return seconds * signs_per_second
