"""Which checkpoint tensors the text model needs, and under what name.

Decided from the name alone, before a tensor's bytes are read, because what
is skipped can be large: DeepSeek V3's multi-token-prediction layer is 11 GB
of FP8, a vision tower a few more.

- Multi-token-prediction (MTP) layers: DeepSeek V3 and GLM-4.5+ checkpoints
  append `num_nextn_predict_layers` decoder layers after the last real one
  (`model.layers.{num_hidden_layers}.*`) for speculative decoding. Skipped,
  unless the engine drafts with them (`load_mtp`): then they map to the
  model's `mtp.` draft (engine/models/mtp.py).
- Multimodal wrappers (Kimi K2.5/K2.6, `kimi_k25`): the language model lives
  under `language_model.`; `vision_tower.*` and `mm_projector.*` are the image
  encoder and its projector. The prefix is stripped and the vision parts
  skipped.
"""

from __future__ import annotations

import logging
import re

from engine.model_files.model_config import ModelConfig

log = logging.getLogger(__name__)

LANGUAGE_MODEL_PREFIX = "language_model."
VISION_PREFIXES = (
    "vision_tower.",
    "vision_model.",
    "mm_projector.",
    "multi_modal_projector.",
)
_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")
# Under an MTP layer's prefix: the names of its input stage and head norm (the rest,
# self_attn, mlp and the layer norms, are its decoder layer's), and the copies of the
# target's embedding and lm_head, which the draft shares instead (engine/models/mtp.py).
MTP_STAGE_NAMES = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")
MTP_SHARED_NAMES = ("embed_tokens.", "shared_head.head.")


class CheckpointNames:
    """Maps checkpoint tensor names to model names, or None for tensors to skip; counts skips."""

    def __init__(self, cfg: ModelConfig, load_mtp: bool = False):
        self.load_mtp = load_mtp
        self.is_wrapped = cfg.wrapper_model_type is not None
        self.wrapper_model_type = cfg.wrapper_model_type
        self.num_layers = cfg.num_layers
        self.num_mtp_layers = int(cfg.get("num_nextn_predict_layers") or 0)
        self.skipped_mtp = 0
        self.skipped_mtp_layers: set[int] = set()
        self.skipped_vision = 0
        self.mtp_tensors = 0  # MTP layer tensors mapped into the draft (load_mtp)

    @property
    def prefix(self) -> str:
        """The prefix checkpoint names carry in front of the text model's names."""
        return LANGUAGE_MODEL_PREFIX if self.is_wrapped else ""

    def map(self, name: str) -> str | None:
        if self.is_wrapped:
            if name.startswith(VISION_PREFIXES):
                self.skipped_vision += 1
                return None
            if name.startswith(LANGUAGE_MODEL_PREFIX):
                name = name[len(LANGUAGE_MODEL_PREFIX) :]
        match = _LAYER_INDEX.match(name)
        if match:
            index = int(match.group(1))
            if self.num_layers <= index < self.num_layers + self.num_mtp_layers:
                if self.load_mtp:
                    return self._mtp_name(index - self.num_layers, name[match.end() :])
                self.skipped_mtp += 1
                self.skipped_mtp_layers.add(index)
                return None
        return name

    def _mtp_name(self, i: int, rest: str) -> str | None:
        """MTP layer i's tensor `rest` -> the model's `mtp.` draft parameter, None for a
        shared copy (skipped unread)."""
        if rest.startswith(MTP_SHARED_NAMES):
            self.skipped_mtp += 1
            self.skipped_mtp_layers.add(self.num_layers + i)
            return None
        self.mtp_tensors += 1
        if rest.startswith(MTP_STAGE_NAMES):
            return f"mtp.layers.{i}.{rest}"
        return f"mtp.layers.{i}.block.{rest}"

    def log_skipped(self) -> None:
        if self.skipped_mtp and self.load_mtp:
            log.info(
                "MTP draft: %d copies of the embedding and lm_head in its layers left unread "
                "(the draft shares the target's)",
                self.skipped_mtp,
            )
        elif self.skipped_mtp:
            layers = ", ".join(str(i) for i in sorted(self.skipped_mtp_layers))
            log.info(
                "skipped %d tensors of multi-token-prediction layer(s) %s "
                "(num_nextn_predict_layers=%d): load them with --speculative mtp",
                self.skipped_mtp,
                layers,
                self.num_mtp_layers,
            )
        if self.skipped_vision:
            log.info(
                "skipped %d vision tower and projector tensors of this %s checkpoint: "
                "image input is not supported yet, the text model is loaded alone",
                self.skipped_vision,
                self.wrapper_model_type,
            )
