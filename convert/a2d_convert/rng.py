"""SplitMix64, the one RNG every a2d backend shares (docs/decoding.md, "The RNG").

Steele, Lea and Flood, "Fast splittable pseudorandom number generators" (OOPSLA 2014), with the
finalizer constants of Vigna's reference splitmix64.c. Python ints keep the arithmetic exact mod 2^64.
"""

from __future__ import annotations

from .errors import A2DError

MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MASK64:
            raise A2DError(f"seed {seed!r} must be an integer in 0..2^64-1")
        self.state = seed

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self) -> float:
        """A double in [0, 1) from the top 53 bits (exact: both factors are representable)."""
        return (self.next_u64() >> 11) * 2.0**-53
