"""One group of identical weight matrices, with the share a tensor-parallel rank holds.

Its own module so the family-specific counts (engine/planner/kimi_weights.py)
and the general one (engine/planner/weight_bytes.py) build the same groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class WeightGroup:
    """`count` identical matrices of rows x cols (rows=1 for vectors)."""

    name: str
    rows: int
    cols: int
    count: int
    role: str  # embed | head | norm | bias | router | linear | expert
    rank_share: Fraction  # fraction of the group one TP rank holds

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count
