"""Loads a model folder: config.json plus safetensors weights, single-file or sharded.

The model is built with its parameters on the meta device, each parameter
then gets uninitialised storage in its final dtype on the target device, and
the checkpoint is streamed into them one tensor at a time, each read only as
far as this rank's slice reaches (engine/weights/lazy.py). A rank's peak
memory during load is therefore its own weights plus one tensor.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.collectives import parallel
from engine.errors import CheckpointError, EngineError
from engine.host.memory_advice import return_free_memory
from engine.layers.moe import SparseMoE
from engine.layers.packed_methods import is_packed_method
from engine.layers.packed_plan import plan_packed_layers
from engine.model_files.gguf_plan import GGUF_WEIGHTS
from engine.model_files.kimi_k3 import refuse_unrun_parts
from engine.model_files.model_config import ModelConfig, load_config
from engine.models import model_class
from engine.models.mtp import build_mtp_draft
from engine.weights.formats import weight_decoder
from engine.weights.lazy import LazyTensor, materialize
from engine.weights.meta_init import materialize_parameters, parameters_on_meta
from engine.weights.names import CheckpointNames

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"


def gguf_weights_file(model_dir: Path) -> Path | None:
    """The GGUF file a model folder takes its weights from, or None (safetensors)."""
    link = Path(model_dir) / GGUF_WEIGHTS
    if not link.is_symlink() and not link.exists():
        return None
    if not link.is_file():
        raise CheckpointError(
            f"{model_dir}: its weights are {link.resolve()}, which is gone; "
            "pass the .gguf file's new path to --model"
        )
    return link


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files a folder's weights live in, checked to exist."""
    index_file = model_dir / SHARD_INDEX
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{index_file} is not a valid shard index: {err}") from None
        files = sorted({model_dir / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(
                f"{model_dir}: shard(s) {', '.join(missing)} listed in {SHARD_INDEX} are "
                "missing; copy the whole checkpoint folder"
            )
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise CheckpointError(
        f"{model_dir} has no safetensors weights ({SINGLE_FILE} or {SHARD_INDEX}); "
        "only safetensors and .gguf checkpoints are read"
    )


def iter_tensors(
    files: list[Path], rename: Callable[[str], str | None] | None = None, lazy: bool = False
) -> Iterator[tuple[str, torch.Tensor | LazyTensor]]:
    """Tensors of the files in turn; `rename` maps a name to the model's, or None to skip it
    unread. `lazy`: LazyTensors, read when sliced, valid until the next one is asked for."""
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    target = rename(name) if rename is not None else name
                    if target is not None:
                        yield target, LazyTensor(handle, name) if lazy else handle.get_tensor(name)
        except (OSError, RuntimeError, ValueError) as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(f"{file} cannot be read as safetensors: {err}") from None


def kv_scales_from_checkpoint(tensors: dict[str, torch.Tensor], num_layers: int):
    """K/V scales (`...layers.N.self_attn.k_scale`) when the checkpoint has them.

    [layers] when each is one value; [layers, kv_heads] when each holds one
    value per head (the engine reduces those to their max unless it keeps
    per-head scales).
    """
    k = [tensors.get(f"model.layers.{i}.self_attn.k_scale") for i in range(num_layers)]
    v = [tensors.get(f"model.layers.{i}.self_attn.v_scale") for i in range(num_layers)]
    if not all(t is not None for t in k + v):
        return None
    sizes = {t.numel() for t in k + v}
    if len(sizes) == 1 and sizes != {1}:
        return torch.stack([t.float().flatten() for t in k]), torch.stack(
            [t.float().flatten() for t in v]
        )
    return torch.stack([t.float().max() for t in k]), torch.stack([t.float().max() for t in v])


_TRIM_EVERY = 16 << 20  # bytes of float32 copies freed between two trims of the heap


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters take `dtype`; buffers (rotary tables) stay float32, as
    transformers keeps them, and so do parameters the model asks to keep
    (MoE routers, whose expert ranking rounding would change)."""
    keep_fp32 = tuple(getattr(model, "fp32_parameter_suffixes", ()))
    freed = 0
    for module_name, module in model.named_modules():
        if is_packed_method(getattr(module, "method", None)):
            continue  # FP8 values, INT4 words and their scales keep their dtypes
        for name, param in module.named_parameters(prefix=module_name, recurse=False):
            if not (keep_fp32 and name.endswith(keep_fp32)) and param.dtype != dtype:
                freed += param.data.nbytes
                param.data = param.data.to(dtype)
                if freed >= _TRIM_EVERY:
                    # The C heap keeps what the float32 copies held: without this the
                    # cast's copies piled up beside them (Kimi-shaped 2B: its peak).
                    return_free_memory()
                    freed = 0


def _use_fused_moe(model: torch.nn.Module) -> None:
    """Stack each MoE block's experts for the fused Triton kernel where it can run."""

    if importlib.util.find_spec("triton") is None:
        return
    blocks = [m for m in model.modules() if isinstance(m, SparseMoE)]
    fused = sum(block.use_fused_kernel() for block in blocks)
    if blocks:
        log.info("fused MoE kernel: %d of %d MoE blocks", fused, len(blocks))


def load_model(
    model_dir: Path,
    dtype: torch.dtype,
    device: torch.device,
    keep_packed: bool = True,
    grid_blocks: bool = False,
    load_mtp: bool = False,
) -> tuple[torch.nn.Module, ModelConfig, tuple[torch.Tensor, torch.Tensor] | None]:
    """Build the engine's model for a folder and fill its weights.

    `keep_packed`: layers whose checkpoint weights are FP8 block-scaled or INT4
    keep that form (engine/layers/packed_plan.py); False dequantizes them all.
    `grid_blocks`: a GGUF file's Q4_0/Q4_1/Q8_0 layers keep their blocks for the
    CPU grid kernel (the caller decides that kernel runs: one rank, CPU, VNNI).
    `load_mtp`: build and fill the checkpoint's MTP layers as `model.mtp`, the
    speculative draft (engine/models/mtp.py), instead of skipping them."""
    model_dir = Path(model_dir)
    cfg = load_config(model_dir)
    # Before any weight is read: a Kimi K3 config names the parts it needs beyond Kimi Linear.
    refuse_unrun_parts(cfg)
    cls = model_class(cfg.architecture)
    gguf_file = gguf_weights_file(model_dir)
    if gguf_file is not None:
        if load_mtp:
            raise EngineError("MTP speculative decoding reads safetensors checkpoints, not GGUF")
        return _load_gguf_model(cls, cfg, gguf_file, dtype, device, grid_blocks)
    files = checkpoint_files(model_dir)
    model = _model_on_meta(cls, cfg, dtype, load_mtp)
    names = CheckpointNames(cfg, load_mtp)

    def wanted(name: str) -> str | None:
        # Decided from the name: what this rank does not hold is never read.
        target = names.map(name)
        return None if target is None or model.skip_checkpoint_tensor(target) else target

    packed = plan_packed_layers(model, cfg, files, wanted) if keep_packed else {}
    materialize_parameters(model, device)
    scale_tensors: dict[str, torch.Tensor] = {}
    # Quantized weights the plan did not keep packed become plain weights in the serving dtype.
    decoder = weight_decoder(cfg, dtype, names.prefix)
    decoder.keep_packed = packed.__contains__

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in decoder.stream(iter_tensors(files, wanted, lazy=True)):
            if name.endswith(("self_attn.k_scale", "self_attn.v_scale")):
                scale_tensors[name] = materialize(tensor)
                continue
            yield name, tensor
        names.log_skipped()

    try:
        model.load_weights(weights())
    except CheckpointError:
        if load_mtp and not names.mtp_tensors:
            # transformers writes num_nextn_predict_layers=1 into configs it saves
            # without MTP tensors (DeepseekV3Config's default): say what is missing.
            raise CheckpointError(
                f"{model_dir} has no MTP layer tensors (model.layers.{cfg.num_layers}.*) "
                "although its config counts num_nextn_predict_layers; MTP speculative "
                "decoding needs them: use --speculative prompt_lookup or none"
            ) from None
        raise
    model.to(device=device)
    if device.type == "cuda":
        _use_fused_moe(model)
    model.eval()
    scales = kv_scales_from_checkpoint(scale_tensors, cfg.num_layers)
    log.info("loaded %s (%s) from %d file(s)", cfg.architecture, model_dir, len(files))
    return model, cfg, scales


def _model_on_meta(
    cls, cfg: ModelConfig, dtype: torch.dtype, load_mtp: bool = False
) -> torch.nn.Module:
    try:
        with parameters_on_meta():
            model = cls(cfg)
            if load_mtp:
                model.mtp = build_mtp_draft(model, cfg)
    except ValueError as err:  # a dimension that does not split over the ranks
        raise EngineError(
            f"{cfg.architecture} cannot be split over {parallel.tp_size()} tensor-parallel "
            f"ranks: {err}; choose a --tp that divides it"
        ) from None
    cast_parameters(model, dtype)
    return model


def _load_gguf_model(cls, cfg: ModelConfig, path: Path, dtype, device, grid_blocks: bool):
    """The model with its weights read from the GGUF file (engine/models/gguf_loader.py)."""
    from engine.models.gguf_loader import (
        GGUFWeights,
        attach_biases,
        install_grid_embedding,
        install_grid_layers,
        install_latent_grids,
    )

    model = _model_on_meta(cls, cfg, dtype)
    weights = GGUFWeights(path)
    filled = set()
    try:
        if grid_blocks:
            filled = install_grid_layers(model, weights) | install_grid_embedding(model, weights)
    finally:
        weights.arena.end_early_region()  # what start-up made resident and the load did not take
    materialize_parameters(model, device)
    model.load_weights(weights.dense(), filled=filled)
    return_free_memory()  # the float32 copies the dense tensors went through
    attach_biases(model)
    if grid_blocks:
        install_latent_grids(model, weights)
    model.to(device=device)
    model.eval()
    weights.arena.collapse_in_background()  # the packed weights into huge pages
    log.info("loaded %s (%s) from %s", cfg.architecture, path.resolve(), path.name)
    return model, cfg, None
