"""Which linear layers keep their checkpoint's FP8 or INT4 weights, decided before allocation.

Read from the safetensors headers (names only, no tensor bytes): a module is
quantized when it has a `weight_scale_inv` (FP8 block) or a `weight_packed`
(INT4). A model layer keeps the packed form when every checkpoint tensor
that fills it (all the shards of a fused q/k/v or gate/up) is quantized the
same way, it is a linear layer whose weight nothing else reads (MLA's
kv_b_proj is marked `keeps_dense`: attention reads its matrix, and the
latent rotation's inverse folds into it), and, for INT4, this rank's columns fall on whole groups. Everything else is
dequantized at load, as before. The plan installs each chosen layer's
method, which swaps its meta `weight` for the packed parameters, so the
BF16 copy is never allocated.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path

from safetensors import safe_open

from engine.layers.linear import FusedLinear, RowParallelLinear
from engine.layers.linear_methods import MethodLinear
from engine.layers.packed_methods import Fp8BlockMethod, Int4GroupMethod
from engine.weights.int4_packed import PackedInt4Scheme

log = logging.getLogger(__name__)

MARKERS = {"fp8": ".weight_scale_inv", "compressed-tensors": ".weight_packed"}


def _quantized_modules(files: list[Path], marker: str, rename) -> set[str]:
    found = set()
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                if name.endswith(marker):
                    target = rename(name[: -len(marker)] + ".weight")
                    if target is not None:
                        found.add(target[: -len(".weight")])
    return found


def plan_packed_layers(model, cfg, files: list[Path], rename) -> dict[str, str]:
    """Install packed methods on the layers that can keep their checkpoint's form.

    `rename` maps a checkpoint tensor name to the model's (None: not loaded).
    Returns {checkpoint module name: method name} for the weight decoder."""
    qc = cfg.quantization or {}
    method_name = qc.get("quant_method")
    if method_name not in MARKERS:
        return {}
    quantized = _quantized_modules(files, MARKERS[method_name], rename)
    shards: dict[str, set] = defaultdict(set)
    owner: dict[str, str] = {}
    for ckpt_module in quantized:
        param, shard = model.checkpoint_target(ckpt_module + ".weight")
        layer = param[: -len(".weight")]
        shards[layer].add(shard)
        owner[ckpt_module] = layer
    chosen: dict[str, str] = {}
    kept_dense: Counter = Counter()
    for layer_name, layer_shards in shards.items():
        try:
            layer = model.get_submodule(layer_name)
        except AttributeError:
            continue  # another rank's expert
        method = _method_for(layer, layer_shards, qc, method_name)
        if method is None:
            kept_dense[type(layer).__name__] += 1
            continue
        method.install(layer)
        chosen[layer_name] = method.name
    if kept_dense:
        log.info("quantized layers dequantized at load: %s", dict(kept_dense))
    return {ckpt: chosen[layer] for ckpt, layer in owner.items() if layer in chosen}


def _method_for(layer, layer_shards: set, qc: dict, method_name: str):
    if not isinstance(layer, MethodLinear) or getattr(layer, "keeps_dense", False):
        return None
    if isinstance(layer, FusedLinear) and None not in layer_shards:
        if layer_shards != set(layer.shard_pieces):
            return None  # part of the fused layer is stored unquantized
    col_start, cols = 0, layer.in_features
    if isinstance(layer, RowParallelLinear):
        col_start = layer.in_piece.start
    if method_name == "fp8":
        block = qc.get("weight_block_size") or (128, 128)
        return Fp8BlockMethod((int(block[0]), int(block[1])), col_start)

    group = PackedInt4Scheme.from_quantization_config(qc).group_size
    if group is None or group % 8 or col_start % group or cols % group:
        return None  # per-channel scales, or this rank's columns cut a group
    return Int4GroupMethod(group)
