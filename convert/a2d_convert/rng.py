"""SplitMix64, the one RNG every a2d backend shares (docs/decoding.md, "The RNG").

Steele, Lea and Flood, "Fast splittable pseudorandom number generators" (OOPSLA 2014), with the
finalizer constants of Vigna's reference splitmix64.c. Python ints keep the arithmetic exact mod 2^64.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import A2DError

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # the state's increment per draw
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # the finalizer's multipliers


class SplitMix64:
    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MASK64:
            raise A2DError(f"seed {seed!r} must be an integer in 0..2^64-1")
        self.state = seed

    def next_u64(self) -> int:
        self.state = (self.state + GAMMA) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * MIX1) & MASK64
        z = ((z ^ (z >> 27)) * MIX2) & MASK64
        return z ^ (z >> 31)

    def uniform(self) -> float:
        """A double in [0, 1) from the top 53 bits (exact: both factors are representable)."""
        return (self.next_u64() >> 11) * 2.0**-53


def uniforms(seeds: Sequence[int], steps: int) -> np.ndarray:
    """[len(seeds), steps] doubles in [0, 1): column t of row r is the (t+1)-th SplitMix64(seeds[r]).uniform(),
    all at once in uint64 arithmetic (which wraps mod 2^64 as the scalar form masks)."""
    state = np.array([s & MASK64 for s in seeds], dtype=np.uint64)[:, None]
    t = np.arange(1, steps + 1, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        z = state + t * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
