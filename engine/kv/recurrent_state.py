"""What one sequence's recurrent state costs: the fixed-size memory of linear-attention layers.

A hybrid model (Kimi Linear: KDA layers beside MLA layers) keeps, per
sequence and per linear-attention layer, a short-convolution state (the last
W-1 inputs of its q/k/v channels) and a delta-rule state (one key_dim x
value_dim float32 matrix per head). Unlike KV pages it does not grow with the
sequence: a sequence costs this once, plus paged KV for its attention layers
only. The engine's state pool and the planner both size it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

# The delta-rule state sums over the whole sequence: kept in float32 whatever the
# serving dtype (transformers and FLA keep it so).
RECURRENT_STATE_BYTES = 4


@dataclass(frozen=True)
class RecurrentStateLayout:
    num_layers: int  # linear-attention layers (those with a state)
    num_heads: int
    key_dim: int
    value_dim: int
    conv_channels: int  # q, k and v channels that pass the short convolution
    conv_width: int  # the convolution's kernel size W; the state keeps W-1 inputs

    def bytes_per_sequence(self, conv_dtype_bytes: int) -> int:
        """Bytes of one sequence's state over all its linear-attention layers; the
        convolution state is kept in the activations' dtype (`conv_dtype_bytes`)."""
        matrix = self.num_heads * self.key_dim * self.value_dim * RECURRENT_STATE_BYTES
        conv = self.conv_channels * (self.conv_width - 1) * conv_dtype_bytes
        return self.num_layers * (matrix + conv)
