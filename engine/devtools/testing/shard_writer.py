"""Safetensors shards written as tensors arrive, so a large checkpoint is never held whole."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


class ShardWriter:
    """Collects tensors into shards of about `shard_mb`, writing each as soon as it is
    full; `close()` writes the last one and the index, as a sharded release has them."""

    def __init__(self, directory: Path, shard_mb: int):
        self.directory = Path(directory)
        self.limit = shard_mb * 2**20
        self.weight_map: dict[str, str] = {}
        self.shard: dict[str, torch.Tensor] = {}
        self.held = self.total = self.index = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.shard[name] = tensor
        size = tensor.numel() * tensor.element_size()
        self.held += size
        self.total += size
        if self.held >= self.limit:
            self._flush()

    def _flush(self) -> None:
        if self.shard:
            self.index += 1
            name = f"model-{self.index:05d}.safetensors"
            save_file(self.shard, str(self.directory / name), metadata={"format": "pt"})
            self.weight_map.update(dict.fromkeys(self.shard, name))
        self.shard, self.held = {}, 0

    def close(self) -> None:
        self._flush()
        index = {"metadata": {"total_size": self.total}, "weight_map": self.weight_map}
        text = json.dumps(index, indent=2)
        (self.directory / "model.safetensors.index.json").write_text(text)
