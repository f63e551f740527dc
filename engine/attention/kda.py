"""Kimi Delta Attention (KDA) in torch: the short causal convolution and the gated delta rule.

KDA is a linear attention whose memory is a fixed-size matrix per head,
S [key_dim, value_dim], instead of a KV cache. Token t, with a key-channel
log decay g_t (<= 0) and a write strength beta_t in (0, 1), updates it as

    S <- diag(exp(g_t)) S                   forget, channel by channel
    delta = beta_t (v_t - S^T k_t)          what S mispredicts for k_t
    S <- S + k_t delta^T                    correct it (the delta rule)
    o_t = S^T q_t

with q and k L2-normalised and q scaled by key_dim^-1/2 (transformers'
KimiLinear and FLA do the same). Decoding runs that recurrence a token at a
time; a prefill runs it in chunks, where the deltas of a chunk come from one
unit-lower-triangular solve instead of a loop over tokens. Both are exact
rewritings of the recurrence, computed in float32 because the state sums
over the whole sequence.

Ahead of it, q, k and v each pass a depthwise causal convolution of width W
(then SiLU). Its state is the last W-1 inputs of the sequence, so a prefill
split into pieces, or followed by decode steps, computes what one pass would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Tokens per chunk of the prefill form (transformers' and FLA's choice). Bounds the
# [heads, chunk, chunk, key_dim] decay tensor a chunk builds.
CHUNK_SIZE = 64
# Added under the square root of the q/k L2 norm (FLA's form: sqrt(sum + eps), not a
# max with eps as F.normalize does).
L2_NORM_EPS = 1e-6


def l2_normalize(x: torch.Tensor, eps: float = L2_NORM_EPS) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def short_conv(
    x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution then SiLU, continuing from `state`.

    x [B, n, C] this step's inputs of B sequences (n tokens each), state [B, W-1, C]
    the inputs before them (zeros for a fresh sequence), weight [C, 1, W]. Returns
    (output [B, n, C] in x's dtype, the new state [B, W-1, C]: the last W-1 inputs).
    The product runs in the weight's dtype, as transformers runs it.
    """
    channels, width = weight.shape[0], weight.shape[-1]
    window = torch.cat([state.to(x.dtype), x], dim=1)  # [B, W-1+n, C]
    out = F.conv1d(window.transpose(1, 2).to(weight.dtype), weight, groups=channels)
    new_state = window[:, window.shape[1] - (width - 1) :]
    return F.silu(out).transpose(1, 2).to(x.dtype), new_state


def delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of B sequences: q, k [B, H, K] (normalised, q scaled),
    v [B, H, V], g [B, H, K] log decay, beta [B, H], state [B, H, K, V], all float32.
    Returns (o [B, H, V], the new state)."""
    state = state * g.exp().unsqueeze(-1)
    predicted = (state * k.unsqueeze(-1)).sum(dim=-2)
    delta = (v - predicted) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (state * q.unsqueeze(-1)).sum(dim=-2), state


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The n tokens of one sequence, chunk by chunk: q, k [n, H, K], v [n, H, V],
    g [n, H, K], beta [n, H], state [H, K, V], all float32. Returns (o [n, H, V],
    the state after the last token).

    Inside a chunk, with G_t the cumulative log decay from the chunk's start and
    S0 the state before it, the recurrence unrolls to
        delta = (I + M)^-1 beta (V - (K * e^G) S0),
        M[t, s] = beta_t sum_c k_t[c] k_s[c] e^(G_t[c] - G_s[c])   (s < t),
        o_t = (q_t * e^G_t) S0 + sum_(s <= t) (q_t . k_s e^(G_t - G_s)) delta_s,
        S = e^(G_last) S0 + sum_s (k_s e^(G_last - G_s)) delta_s^T.
    Decays are only formed as differences G_t - G_s with s <= t, so nothing
    overflows however long the chunk forgets for.
    """
    q, k, v, g = (x.transpose(0, 1) for x in (q, k, v, g))  # [H, n, ...]
    beta = beta.transpose(0, 1)  # [H, n]
    heads, length = q.shape[:2]
    out = torch.empty(heads, length, v.shape[-1], dtype=torch.float32, device=q.device)
    for start in range(0, length, chunk_size):
        end = min(start + chunk_size, length)
        qc, kc, vc, bc = q[:, start:end], k[:, start:end], v[:, start:end], beta[:, start:end]
        cum = g[:, start:end].cumsum(dim=1)  # [H, C, K]
        size = end - start
        later = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)  # s > t
        # k_s e^(G_t - G_s) for s <= t, zero above the diagonal: [H, C(t), C(s), K], the
        # one chunk-squared tensor; both products below contract it without copies.
        decay = (cum.unsqueeze(2) - cum.unsqueeze(1)).masked_fill(later[..., None], -torch.inf)
        keys_decayed = kc.unsqueeze(1) * decay.exp()
        kk = torch.einsum("htk,htsk->hts", kc, keys_decayed)
        qk = torch.einsum("htk,htsk->hts", qc, keys_decayed)  # s <= t
        # I + M: unit lower triangular (kk is zero above the diagonal already).
        mix = (bc.unsqueeze(-1) * kk).tril(-1) + torch.eye(size, dtype=kk.dtype, device=kk.device)
        from_start = cum.exp()  # e^G_t: the decay since the chunk's start
        rhs = bc.unsqueeze(-1) * (vc - (kc * from_start) @ state)
        delta = torch.linalg.solve_triangular(mix, rhs, upper=False, unitriangular=True)
        out[:, start:end] = (qc * from_start) @ state + qk @ delta
        last = cum[:, -1:]  # [H, 1, K]
        state = (
            state * last.transpose(1, 2).exp() + ((last - cum).exp() * kc).transpose(1, 2) @ delta
        )
    return out.transpose(0, 1), state
