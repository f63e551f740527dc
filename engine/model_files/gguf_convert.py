"""Convert a GGUF file into a Hugging Face model folder.

The folder holds config.json, model.safetensors (float32), tokenizer.json,
tokenizer_config.json (with the chat template), chat_template.jinja and
generation_config.json, so that both the engine's loader and transformers'
`AutoModelForCausalLM` / `AutoTokenizer` read it like any downloaded model.
Every family the engine serves is read (gguf_families.py: llama, qwen2,
glm4, glm4moe, deepseek2); the vocabulary is rebuilt by gguf_tokenizer.py.

Weights are dequantized and stored as float32: every GGUF block format
dequantizes to values that float32 holds exactly, while bfloat16 would round
them a second time. config.json still says bfloat16, the dtype the model was
trained in and the one to compute in. Each Hugging Face tensor is made by its
tensor plan (gguf_plan.py) from the rows of the GGUF tensors it comes from,
dequantizing only those rows.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, quants
from tqdm import tqdm

from engine.errors import ModelError
from engine.model_files.gguf_families import REFETCH_HINT, SUPPORTED_ARCHITECTURES, GGUFModel
from engine.model_files.gguf_header import GGUFFile
from engine.model_files.gguf_models import plan_model
from engine.model_files.gguf_plan import GGUF_WEIGHTS, materialize, row_view_shape
from engine.model_files.gguf_tokenizer import rebuild_tokenizer

__all__ = ["SUPPORTED_ARCHITECTURES", "convert_gguf", "read_gguf"]

log = logging.getLogger(__name__)


def convert_gguf(
    gguf_path: Path, out_dir: Path, progress: bool = False, link_weights: bool = False
) -> Path:
    """Convert `gguf_path` into a model folder at `out_dir` and return `out_dir`.

    `link_weights`: the folder links the file as `model.gguf` instead of holding
    float32 weights, and the engine reads them from the file itself
    (engine/models/gguf_loader.py); without it, model.safetensors, which
    transformers reads too. The folder is built under a temporary name next to
    `out_dir` and renamed into place at the end, so an interrupted conversion
    leaves nothing behind. An existing `out_dir` is replaced.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader, metadata, model = read_gguf(gguf_path)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = model.config
    tokenizer, tokenizer_config = rebuild_tokenizer(
        metadata, config["vocab_size"], config["max_position_embeddings"]
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        building.chmod(0o755)  # mkdtemp makes it private; a model folder is an ordinary folder
        if link_weights:
            (building / GGUF_WEIGHTS).symlink_to(gguf_path.resolve())
        else:
            _write_weights(tensors, model, building / "model.safetensors", progress)
        tokenizer.save(str(building / "tokenizer.json"))
        _write_json(building / "config.json", config)
        _write_json(building / "tokenizer_config.json", tokenizer_config)
        _write_json(building / "generation_config.json", _generation_config(config))
        if tokenizer_config.get("chat_template"):
            (building / "chat_template.jinja").write_text(tokenizer_config["chat_template"])
        _move_into_place(building, out_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return out_dir


# --- reading -----------------------------------------------------------------


def read_gguf(path: Path) -> tuple[GGUFFile, dict[str, Any], GGUFModel]:
    """The checked file, its metadata as plain values, and the model it holds (config and
    tensor plan); the tensor data stays memory-mapped in the file's reader."""
    reader = _open_gguf(Path(path))
    metadata = reader.metadata
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
    model = plan_model(metadata, shapes)
    if model.skipped:
        log.info(
            "%s: left out %d GGUF tensors of %s (multi-token-prediction layers, or split copies "
            "of a tensor the file also holds whole): MTP speculative decoding is not supported yet",
            Path(path).name,
            len(model.skipped),
            ", ".join(sorted({".".join(name.split(".")[:2]) for name in model.skipped})),
        )
    return reader, metadata, model


def _open_gguf(path: Path) -> GGUFFile:
    if not path.is_file():
        raise ModelError(f"GGUF file not found: {path}")
    with path.open("rb") as file:
        magic = file.read(4)
    if magic != b"GGUF":
        raise ModelError(
            f"{path} is not a GGUF file (it does not start with the GGUF magic bytes); "
            f"check the path, or {REFETCH_HINT}."
        )
    try:
        reader = GGUFFile(path)
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError, struct.error) as error:
        raise ModelError(f"{path} is truncated or corrupt ({error}); {REFETCH_HINT}.") from error
    # The reader maps tensor data lazily, so a file cut inside the last tensor
    # can still parse: check that every tensor ends inside the file.
    file_size = path.stat().st_size
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > file_size:
            raise ModelError(
                f"{path} is truncated (tensor {tensor.name} is cut off); {REFETCH_HINT}."
            )
    return reader


# --- config ------------------------------------------------------------------


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {key: config[key] for key in keys if config[key] is not None}


# --- weights -----------------------------------------------------------------


def dequantized_rows(tensor, rows: np.ndarray | slice) -> np.ndarray:
    """Those rows of the tensor's row view (gguf_plan.py), dequantized to float32."""
    total, columns = row_view_shape(tuple(reversed(tensor.shape.tolist())))
    raw = tensor.data.reshape(total, -1)[rows]
    try:
        values = quants.dequantize(raw, tensor.tensor_type)
    except NotImplementedError as error:
        raise ModelError(
            f"GGUF tensor {tensor.name} uses {GGMLQuantizationType(tensor.tensor_type).name}, "
            "which the installed gguf package cannot dequantize; upgrade gguf or use another file."
        ) from error
    return np.asarray(values, dtype=np.float32).reshape(-1, columns)


def _write_weights(tensors: dict, model: GGUFModel, path: Path, progress: bool) -> None:
    """Stream float32 tensors into a safetensors file, one tensor in memory at a time."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for plan in model.plans:
        size = 4 * int(np.prod(plan.shape))
        header[plan.name] = {
            "dtype": "F32",
            "shape": list(plan.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # the format asks for 8-byte alignment

    def rows(source: str, selection) -> np.ndarray:
        return dequantized_rows(tensors[source], selection)

    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(header_bytes)) + header_bytes)
        bar = tqdm(model.plans, desc="Converting", unit="tensor", disable=not progress)
        for plan in bar:
            file.write(materialize(plan, rows).tobytes())


# --- writing -----------------------------------------------------------------


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _move_into_place(built: Path, out_dir: Path) -> None:
    if out_dir.exists():
        # Rename the old folder away first: a directory cannot be renamed onto a full one.
        stale = out_dir.with_name(f".{out_dir.name}.stale-{uuid.uuid4().hex[:8]}")
        out_dir.rename(stale)
        built.rename(out_dir)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        built.rename(out_dir)
