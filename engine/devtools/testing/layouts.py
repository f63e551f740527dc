"""Reading and rewriting checkpoint folders into the on-disk layouts real releases use.

transformers saves DeepseekV3 as `deepseek_v3` with `rope_parameters`; Kimi
releases differ, and the engine must read them as released:

- Kimi K2 (K2-Instruct, K2-Thinking): `model_type: kimi_k2`, `rope_theta` +
  `rope_scaling` (with `type`), a `head_dim` that is not an MLA head size, an
  `auto_map` naming code the engine must never run, sharded safetensors with
  `model.safetensors.index.json`.
- Kimi K2.5/K2.6: a `kimi_k25` wrapper with the K2 config under
  `text_config`, the language model's tensors under `language_model.`, and a
  vision tower and projector beside it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

INDEX_FILE = "model.safetensors.index.json"
KIMI_SHARD_BYTES = 200_000  # small, so even tiny checkpoints are split like real ones
_CODE_STUB = '"""Checkpoint code: the engine must never run it."""\n\nraise RuntimeError("{name} was executed")\n'


def read_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def write_config(directory: Path, config: dict) -> None:
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def save_sharded(directory: Path, tensors: dict[str, torch.Tensor], shard_bytes: int) -> None:
    """`model-0000i-of-0000n.safetensors` of at most shard_bytes each (one tensor may exceed it) + index."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))


def copy_checkpoint(
    src: Path,
    dst: Path,
    tensors: dict[str, torch.Tensor],
    config_edit: Callable[[dict], dict] | None = None,
    shard_bytes: int | None = None,
) -> Path:
    """A new folder with src's tokenizer and config (edited) and these tensors.

    One `model.safetensors` unless shard_bytes is given, then shards and an index.
    """
    dst.mkdir(parents=True, exist_ok=True)
    for file in src.iterdir():
        if file.suffix != ".safetensors" and file.name != INDEX_FILE and file.is_file():
            shutil.copy(file, dst / file.name)
    config = read_config(src)
    write_config(dst, config_edit(config) if config_edit else config)
    if shard_bytes is None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    else:
        save_sharded(dst, tensors, shard_bytes)
    return dst


def write_code_stubs(directory: Path, names: list[str]) -> None:
    """Files an `auto_map` names, each raising if run: loading must not execute checkpoint code."""
    for name in names:
        (directory / name).write_text(_CODE_STUB.format(name=name))


def _kimi_k2_config(config: dict) -> dict:
    rope = dict(config.pop("rope_parameters"))
    config["model_type"] = "kimi_k2"
    config["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    config["rope_scaling"] = rope
    # Real configs' head_dim (when present) is not an MLA head size; make misuse visible.
    config["head_dim"] = 128
    config["torch_dtype"] = config.pop("dtype", "bfloat16")
    config["auto_map"] = {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    }
    # DeepseekV3 fields Kimi's config spells out; the engine reads routing from the others.
    config.setdefault("topk_method", "noaux_tc")
    config.setdefault("scoring_func", "sigmoid")
    return config


def as_kimi_k2(src: Path, dst: Path) -> Path:
    """Rewrite a DeepseekV3 checkpoint as Kimi K2 ships: kimi_k2 config, sharded, auto_map code."""
    path = copy_checkpoint(src, dst, read_tensors(src), _kimi_k2_config, KIMI_SHARD_BYTES)
    write_code_stubs(path, ["configuration_deepseek.py", "modeling_deepseek.py"])
    return path


def as_kimi_k25(src: Path, dst: Path) -> Path:
    """Nest a DeepseekV3 checkpoint as Kimi K2.5 does: kimi_k25 wrapper, language_model.* names."""
    generator = torch.Generator().manual_seed(0)
    tensors = {f"language_model.{k}": v for k, v in read_tensors(src).items()}
    tensors["vision_tower.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2, generator=generator)
    tensors["mm_projector.proj.0.weight"] = torch.randn(64, 32, generator=generator)

    def edit(text: dict) -> dict:
        text = _kimi_k2_config(dict(text))
        text.pop("architectures")
        text.pop("auto_map")
        return {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "auto_map": {
                "AutoConfig": "configuration_kimi_k25.KimiK25Config",
                "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
            },
            "model_type": "kimi_k25",
            "text_config": text,
            "vision_config": {"patch_size": 14, "hidden_size": 32},
        }

    path = copy_checkpoint(src, dst, tensors, edit, KIMI_SHARD_BYTES)
    write_code_stubs(path, ["configuration_kimi_k25.py", "modeling_kimi_k25.py"])
    return path
