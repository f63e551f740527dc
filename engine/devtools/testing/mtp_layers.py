"""Tiny checkpoints with multi-token-prediction (MTP) layers, for MTP speculative decoding.

transformers' model classes build no MTP layers (they drop them at load), so the
tiny DeepSeek V3, GLM-4.5, DeepSeek V3.2 and GLM-5 checkpoints they save have none.
`add_mtp_layers` appends them to a saved folder the way the released checkpoints
carry them: `num_nextn_predict_layers` in config.json and, for MTP layer i, tensors
under `model.layers.{num_hidden_layers + i}.`:

- the decoder layer: every tensor the last target layer has (self_attn, the MoE
  mlp with its router, the indexer for DSA models, the layer norms), same names
  and shapes, fresh random values of the same spread (norm gains near 1, the
  router's correction bias copied);
- the input stage and head: `enorm`, `hnorm`, `shared_head.norm` (gains), `eh_proj`
  (hidden x 2*hidden), and `embed_tokens` and `shared_head.head`, copies of the
  target's as in the releases.

`copying=True` builds instead a checkpoint whose MTP layer provably drafts what the
target will say (a principled acceptance test, not a hoped-for one): every
attention output (o_proj) and MLP output (down_proj) of the target and of the MTP
layer is zero, so the target's next token is a fixed function f of its current
token, lm_head(norm(embed(t))); the MTP layer's eh_proj keeps only the embedding
half ([I | 0]), with unit enorm and shared_head.norm equal to the final norm, so
from (h_p, t_{p+1}) it computes lm_head(norm(embed(t_{p+1}))) = f(t_{p+1}), the
target's very next token. Every draft is accepted, chained ones too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.devtools.testing.layouts import read_config, read_tensors, write_config

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
_ZEROED = ("o_proj.weight", "down_proj.weight")


def _fresh(name: str, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random tensor shaped like `like`: gains near 1 for norms, the same spread otherwise."""
    if like.dim() == 1:
        if "norm" in name:
            return 1.0 + 0.1 * torch.randn(like.shape, generator=generator)
        return like.clone()  # biases and the router's correction bias: as the target's
    spread = float(like.float().std()) or 0.02
    return (spread * torch.randn(like.shape, generator=generator)).to(like.dtype)


def add_mtp_layers(directory: Path, count: int = 1, seed: int = 0, copying: bool = False) -> Path:
    """Append `count` MTP layers to the checkpoint in `directory` (module docstring)."""
    directory = Path(directory)
    config = read_config(directory)
    tensors = read_tensors(directory)
    num_layers = config["num_hidden_layers"]
    hidden = config["hidden_size"]
    generator = torch.Generator().manual_seed(seed)
    last = {
        match.group(2): tensor
        for name, tensor in tensors.items()
        if (match := _LAYER.match(name)) and int(match.group(1)) == num_layers - 1
    }
    for i in range(count):
        prefix = f"model.layers.{num_layers + i}."
        for rest, like in last.items():
            tensors[prefix + rest] = _fresh(rest, like, generator)
        dtype = tensors["model.embed_tokens.weight"].dtype
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"{prefix}{norm}.weight"] = _fresh(norm, torch.ones(hidden), generator)
        eh_proj = torch.empty(hidden, 2 * hidden)
        tensors[f"{prefix}eh_proj.weight"] = _fresh("eh_proj", eh_proj.normal_(0, 0.05), generator)
        tensors[f"{prefix}embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
        head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
        tensors[f"{prefix}shared_head.head.weight"] = head.clone()
        if copying:
            tensors[f"{prefix}enorm.weight"] = torch.ones(hidden)
            tensors[f"{prefix}shared_head.norm.weight"] = tensors["model.norm.weight"].clone()
            tensors[f"{prefix}eh_proj.weight"] = torch.cat(
                [torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1
            )
        for name in [n for n in tensors if n.startswith(prefix)]:
            tensors[name] = tensors[name].to(dtype).contiguous()
    if copying:
        for name in tensors:
            if name.endswith(_ZEROED):
                tensors[name] = torch.zeros_like(tensors[name])
    _save(directory, tensors)
    config["num_nextn_predict_layers"] = count
    write_config(directory, config)
    return directory


def _save(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """All tensors into one model.safetensors, replacing whatever files held them."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        for shard in set(json.loads(index.read_text())["weight_map"].values()):
            (directory / shard).unlink()
        index.unlink()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
