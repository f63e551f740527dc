"""Kimi Delta Attention as a decoder layer's attention: Kimi Linear's linear-attention layers.

Per token: q, k, v projections, each through its short causal convolution
(`q_conv1d`, `k_conv1d`, `v_conv1d`, then SiLU); a per-channel forget gate
g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias) (a log decay per head and
key channel); a write strength beta = sigmoid(b_proj(x)) per head; the gated
delta rule (engine/attention/kda.py) with q and k L2-normalised; then per head
an RMS norm gated by sigmoid(g_b(g_a(x))) and the output projection. The
names are the checkpoint's; the dtypes follow transformers' KimiLinear: the
gate, the rule and the output norm in float32, the rest in the serving dtype.

The layer keeps no KV: each sequence's convolution and delta-rule state sit in
the engine's state pool (engine/kv/state_pool.py), slot by sequence, and
`ctx.states` says which slots this step's sequences hold. Sequences with one
token this step run the recurrence together; each sequence with more runs
the chunked form from its state.

Under tensor parallelism the heads split as attention's do: each rank holds
its heads' rows of q/k/v, of their convolution kernels (the convolution is per
channel), of the gate's up-projections f_b and g_b, of beta's b_proj, dt_bias
and A_log, and its heads' columns of o_proj, whose partial sums the layer
all-reduces. The down-projections f_a and g_a (hidden -> head_dim, shared by
all heads) and the per-head output norm are replicated. Each rank's state pool
holds its own heads' states (KimiLinearForCausalLM.recurrent_state_layout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.kda import delta_rule_chunked, delta_rule_step, l2_normalize, short_conv
from engine.collectives import parallel
from engine.layers.linear import ColumnParallelLinear, RowParallelLinear, RowSlice
from engine.model_files.model_config import ModelConfig
from engine.models.decoder import ForwardContext
from engine.weights.lazy import materialize


def _load_slice(param: nn.Parameter, tensor, dim: int, piece: RowSlice, name: str) -> None:
    """Copy this rank's `piece` of a checkpoint tensor along `dim` into `param`."""
    if tensor.shape[dim] != piece.full:
        raise ValueError(f"{name} has {tensor.shape[dim]} along dim {dim}, expected {piece.full}")
    part = tensor.narrow(dim, piece.start, piece.size)
    if tuple(part.shape) != tuple(param.shape):
        raise ValueError(f"{name}: this rank's part {tuple(part.shape)} != {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(materialize(part))


class ConvWeight(nn.Module):
    """A depthwise convolution's kernel [channels, 1, width], as the checkpoint stores it;
    this rank holds the channels of `piece`."""

    def __init__(self, piece: RowSlice, width: int):
        super().__init__()
        self.piece = piece
        self.weight = nn.Parameter(torch.zeros(piece.size, 1, width))

    def load_checkpoint(self, kind: str, tensor) -> None:
        _load_slice(self.weight, tensor, 0, self.piece, kind)


class GatedHeadNorm(nn.Module):
    """RMS norm over each head's values, times sigmoid(gate), all in float32 (the weight
    too), back to the input's dtype: the output norm of a KDA layer."""

    def __init__(self, head_dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight.float() * h * torch.sigmoid(gate.float())
        return h.to(x.dtype)


class KimiDeltaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, state_index: int):
        super().__init__()
        self.state_index = state_index  # this layer's place in the state pool
        hidden = cfg.hidden_size
        total_heads = cfg["linear_num_heads"]
        self.head_dim = dim = cfg["linear_head_dim"]
        width = cfg["linear_conv_kernel_dim"]
        # This rank's heads (all of them at TP 1): as channels, and as one value a head.
        self.channels = RowSlice.heads(total_heads, dim, "linear_num_heads")
        self.head_piece = RowSlice.heads(total_heads, 1, "linear_num_heads")
        self.num_heads = heads = self.head_piece.size
        self.qkv_dim = qkv = heads * dim

        def linear(n_in: int, n_out: int | RowSlice) -> ColumnParallelLinear:
            return ColumnParallelLinear(n_in, n_out, bias=False)

        self.q_proj, self.k_proj, self.v_proj = (linear(hidden, self.channels) for _ in range(3))
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (
            ConvWeight(self.channels, width) for _ in range(3)
        )
        self.f_a_proj, self.f_b_proj = linear(hidden, dim), linear(dim, self.channels)
        # Stays float32 (the model lists it in fp32_parameter_suffixes), as transformers keeps it.
        self.dt_bias = nn.Parameter(torch.zeros(qkv))
        self.A_log = nn.Parameter(torch.zeros(1, 1, heads, 1))
        self.b_proj = linear(hidden, self.head_piece)
        self.g_a_proj, self.g_b_proj = linear(hidden, dim), linear(dim, self.channels)
        self.o_norm = GatedHeadNorm(dim, cfg.get("rms_norm_eps", 1e-6))
        self.o_proj = RowParallelLinear(self.channels, hidden, bias=False)

    def load_checkpoint(self, kind: str, tensor) -> None:
        """The layer's own parameters: this rank's channels of dt_bias, heads of A_log."""
        if kind == "dt_bias":
            _load_slice(self.dt_bias, tensor, 0, self.channels, kind)
        elif kind == "A_log":
            _load_slice(self.A_log, tensor, 2, self.head_piece, kind)
        else:
            raise KeyError(f"{kind}: a KDA layer has no such parameter")

    def enable_kv_rotation(self, batch_invariant: bool = False) -> str:
        return "KDA layers: no KV cache to rotate"

    def conv_weight(self) -> torch.Tensor:
        """q, k and v kernels as one [3 * qkv, 1, W] depthwise kernel (the state's channel order)."""
        return torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight])

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """The forget gate: [T, heads, head_dim] float32, <= 0."""
        raw = self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()
        rate = self.A_log.float().exp().view(self.num_heads, 1)
        return -rate * F.softplus(raw.view(-1, self.num_heads, self.head_dim))

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        states = ctx.states
        if states is None:
            raise RuntimeError("KDA layers need the step's recurrent states (ctx.states)")
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        g = self.log_decay(x)
        beta = torch.sigmoid(self.b_proj(x))
        core = x.new_empty(x.shape[0], self.num_heads, self.head_dim)
        weight = self.conv_weight()
        conv_states = states.pool.conv[self.state_index]
        rule_states = states.pool.recurrent[self.state_index]
        tokens, slots = states.decode_rows()
        if len(tokens):
            convolved, conv_states[slots] = short_conv(
                mixed[tokens].unsqueeze(1), conv_states[slots], weight
            )
            q, k, v = self._heads(convolved.squeeze(1))
            out, rule_states[slots] = delta_rule_step(
                q, k, v, g[tokens], beta[tokens].float(), rule_states[slots]
            )
            core[tokens] = out.to(core.dtype)
        for first, count, slot in states.prefill_runs():
            rows = slice(first, first + count)
            convolved, new_conv = short_conv(
                mixed[rows].unsqueeze(0), conv_states[slot].unsqueeze(0), weight
            )
            conv_states[slot] = new_conv[0]
            q, k, v = self._heads(convolved[0])
            out, rule_states[slot] = delta_rule_chunked(
                q, k, v, g[rows], beta[rows].float(), rule_states[slot]
            )
            core[rows] = out.to(core.dtype)
        gate = self.g_b_proj(self.g_a_proj(x)).view(-1, self.num_heads, self.head_dim)
        return parallel.all_reduce(self.o_proj(self.o_norm(core, gate).flatten(1)))

    def _heads(self, convolved: torch.Tensor):
        """[T, 3 * qkv] -> float32 q (normalised and scaled), k (normalised), v: [T, H, D]."""
        q, k, v = convolved.float().view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        return l2_normalize(q) * self.head_dim**-0.5, l2_normalize(k), v
