"""What every model shares: the forward context and checkpoint-name mapping for fused layers."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.collectives import parallel
from engine.errors import CheckpointError, UnsupportedModelError
from engine.kv.rotation import HadamardRotation
from engine.kv.sizing import KVLayout
from engine.layers.linear import ColumnParallelLinear, FusedLinear
from engine.layers.moe import is_local_expert_tensor
from engine.layers.norm import RMSNorm
from engine.layers.packed_methods import is_packed_method
from engine.layers.rotary import RotaryEmbedding
from engine.layers.vocab_parallel import ParallelLMHead
from engine.models.decoder import ForwardContext, GatedMLP, LlamaModel, PreNormDecoderLayer
from engine.weights.lazy import materialize


class CausalLM(nn.Module):
    """Base for decoder-only models: embed -> layers -> norm -> lm_head."""

    # checkpoint module name -> (fused module name, shard name)
    packed_modules: dict[str, tuple[str, str]] = {}
    # checkpoint tensors that carry nothing the engine needs
    ignored_suffixes: tuple[str, ...] = ("rotary_emb.inv_freq",)
    tie_word_embeddings: bool = False
    # Whether --deterministic's batch-invariant kernels cover every reduction it runs.
    supports_deterministic: bool = False

    def build(self, cfg, layer_factory) -> None:
        """embed -> layers from `layer_factory(i)` -> norm, and lm_head (tied if configured)."""
        self.config = cfg
        self.model = LlamaModel(cfg, layer_factory)
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size)
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext):
        return self.model(input_ids, positions, ctx)

    def kv_layout(self) -> KVLayout:
        """What one token costs in this rank's KV cache; GQA by default, MLA models override."""
        cfg = self.config
        return KVLayout(
            num_layers=cfg.num_layers,
            kind="gqa",
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
        ).for_rank(parallel.tp_size())

    def enable_kv_rotation(self, batch_invariant: bool = False) -> str:
        """Rotate K and V before the cache in every layer (DESIGN.md §3); says what is used.

        `batch_invariant` (deterministic mode) rotates each row by the same
        butterfly arithmetic however many rows run together."""
        described = set()
        for layer in self.model.layers:
            enable = getattr(layer.self_attn, "enable_kv_rotation", None)
            if enable is None:
                raise UnsupportedModelError(
                    f"{type(self).__name__} does not implement --kv-rotation hadamard"
                )
            described.add(enable(batch_invariant))
        return "; ".join(sorted(described))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary float32 logits on every rank (gathered from the vocab shards).

        The head's linear method computes them (a CPU grid writes float32 straight
        from its accumulators; engine/layers/linear_methods.py)."""
        head = self.lm_head
        return head.gather(head.method.logits(head, hidden)).float()

    def use_decode_step(self, step) -> None:
        """Run whole decode steps with `step` (a FusedDecode of engine/models/, chosen at
        load), which declines the steps it does not cover; None: the layers always."""
        self.model.decode_step = step

    def use_layer_ops(self, ops) -> dict[str, int]:
        """Compute norms, SwiGLU, rotary and the K/V rotations with `ops` (chosen once,
        at load: engine/layers/layer_ops.py); returns how many of each now use it."""
        users = {
            RMSNorm: "norm",
            GatedMLP: "mlp",
            PreNormDecoderLayer: "layer",
            RotaryEmbedding: "rotary",
        }
        counts = dict.fromkeys([*users.values(), "rotation"], 0)
        rotations: dict[int, HadamardRotation] = {}
        for module in self.modules():
            for kind, name in users.items():
                if isinstance(module, kind):
                    module.ops = ops
                    counts[name] += 1
            # The run-time K/V rotations: GQA's, MLA's latent and rope key;
            # deterministic mode's butterflies do not use the ops.
            for attribute in ("kv_rotation", "latent_rotation", "rope_rotation"):
                rotation = getattr(module, attribute, None)
                if isinstance(rotation, HadamardRotation) and not rotation.batch_invariant:
                    rotations[id(rotation)] = rotation
        for rotation in rotations.values():
            rotation.ops = ops
            counts["rotation"] += 1
        return counts

    def checkpoint_target(self, name: str) -> tuple[str, str | None]:
        """Map a checkpoint tensor name to (parameter name, shard or None)."""
        for ckpt_module, (fused_module, shard) in self.packed_modules.items():
            token = f".{ckpt_module}."
            if token in name:
                return name.replace(token, f".{fused_module}."), shard
        return name, None

    def load_weights(
        self, tensors: Iterable[tuple[str, torch.Tensor]], filled: Iterable[str] = ()
    ) -> None:
        """Copy checkpoint tensors (whole or lazily read) into this rank's parameters;
        every parameter must be filled (`filled`: those a loader already filled another
        way, named as `_load_one` names them). Split layers take only their slice."""
        params = dict(self.named_parameters())
        filled = set(filled)
        for name, tensor in tensors:
            if name.endswith(self.ignored_suffixes):
                continue
            if self.skip_checkpoint_tensor(name):
                continue
            target, shard = self.checkpoint_target(name)
            if target not in params:
                raise CheckpointError(f"checkpoint tensor {name!r} matches no parameter")
            module_name, kind = target.rsplit(".", 1)
            module = self.get_submodule(module_name)
            try:
                filled.update(self._load_one(module, target, kind, shard, tensor))
            except (ValueError, KeyError) as err:
                raise CheckpointError(f"{name}: {err}") from None
        self._check_complete(params, filled)

    def _load_one(self, module: nn.Module, target: str, kind: str, shard, tensor) -> list[str]:
        """Load one checkpoint tensor into `module`; returns what it filled."""
        if shard is not None:
            module.load_shard(shard, kind, tensor)
            return [f"{target}:{shard}"]
        if hasattr(module, "load_checkpoint"):
            module.load_checkpoint(kind, tensor)
            return [target]
        if isinstance(module, FusedLinear):  # the checkpoint fuses the shards already
            module.load_concatenated(kind, tensor)
            return [f"{target}:{s}" for s in module.shard_offsets]
        param = getattr(module, kind)
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(
                f"checkpoint shape {tuple(tensor.shape)} != model {tuple(param.shape)}"
            )
        with torch.no_grad():
            param.copy_(materialize(tensor))
        return [target]

    def skip_checkpoint_tensor(self, name: str) -> bool:
        """Tensors this rank does not hold: a tied head, other ranks' experts (expert
        parallel). Decided from the name, so the loader never reads them."""
        if self.tie_word_embeddings and name == "lm_head.weight":
            return True
        return not is_local_expert_tensor(name)

    def _check_complete(self, params: dict[str, nn.Parameter], filled: set[str]) -> None:
        missing = []
        for name in params:
            if name in filled or (self.tie_word_embeddings and name == "lm_head.weight"):
                continue
            module_name, kind = name.rsplit(".", 1)
            module = self.get_submodule(module_name)
            if kind not in ("weight", "bias") and is_packed_method(getattr(module, "method", None)):
                continue  # a packed weight's scales come with its `weight`
            if isinstance(module, FusedLinear) and not isinstance(module, ColumnParallelLinear):
                missing += [
                    f"{name}:{s}" for s in module.shard_offsets if f"{name}:{s}" not in filled
                ]
            elif name not in filled:
                missing.append(name)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise CheckpointError(
                f"checkpoint is missing {len(missing)} tensors ({shown}); "
                "is a shard missing or the download incomplete?"
            )
