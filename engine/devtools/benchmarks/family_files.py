"""The files `resident bench families` measures: each family's random-weight checkpoint at
realistic size (engine.devtools.testing.realistic_checkpoints), and llama.cpp's GGUF of it.

Both are written once into a work folder and reused while their recipe (the
config, the tokenizer, the converter and quantizer options) is unchanged;
a folder is written under a temporary name and renamed when whole, so an
interrupted run never leaves a half checkpoint that looks reusable.

The GGUF is made the way a user makes one: llama.cpp's convert_hf_to_gguf.py
to F32 (through tests/engine/llama_cpp_convert.py, which answers the
pre-tokenizer lookup a test tokenizer is missing from), then llama-quantize to
Q4_1. The checkpoint's linear weights already lie on the Q4_1 grid and its
embedding and head on the Q8_0 grid, so requantizing reproduces them: both
engines hold the same values. llama-quantize's Q4_1 would make the embedding
Q4_1 and the head Q6_K, so both are asked for as Q8_0. What it keeps in
another type (norms, biases and routers stay F32) is counted per type.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from engine.devtools.benchmarks.decode_bytes import Held, decode_bytes
from engine.devtools.testing.realistic_checkpoints import (
    SHAPES,
    parameter_shapes,
    realistic_config,
    write_realistic_checkpoint,
)
from engine.devtools.testing.tokenizers import save_bpe_tokenizer, save_glm_tokenizer
from engine.model_files.config_aliases import normalise_keys

FAMILIES = tuple(SHAPES)
LLAMA_CPP_ENV = "RESIDENT_LLAMA_CPP"
QUANT = "Q4_1"
# What llama-quantize is asked for, per file type the bench makes. Q4_1: the checkpoint's
# own grids (module docstring). Q4_K_M: what CPU users download, with llama-quantize's
# own choices (Q4_K and Q6_K by tensor, a Q4_K embedding and a Q6_K head, Q5_0 where a
# row is not whole super-blocks); its values are no longer the checkpoint's, so Resident
# then reads the GGUF file too.
QUANTIZE_OPTIONS = {
    "Q4_1": ("--token-embedding-type", "q8_0", "--output-tensor-type", "q8_0"),
    "Q4_K_M": (),
}
QUANTS = tuple(QUANTIZE_OPTIONS)
PEER_BINARIES = ("llama-bench", "llama-server")
# The converter's wrapper lives with the tests that share it; a checkout has it.
CONVERT_WRAPPER = Path(__file__).resolve().parents[3] / "tests" / "engine" / "llama_cpp_convert.py"
# family: (tokenizer saver, the pre-tokenizer name the wrapper answers for it). llama.cpp's
# GLM converter insists on GLM's special tokens; the others take a GPT-2-split BPE.
_TOKENIZERS = {
    "llama": (save_bpe_tokenizer, "gpt-2"),
    "glm4_moe": (save_glm_tokenizer, "glm4"),
    "kimi_k2": (save_bpe_tokenizer, "gpt-2"),
    "glm5": (save_glm_tokenizer, "glm4"),  # GlmMoeDsaModel reads GLM's vocabulary as GLM-4's
    "kimi_linear": (save_bpe_tokenizer, "gpt-2"),  # its converter tries a GPT-2 BPE first
}
# Kimi K2's and GLM-5's own config.json say how they route; transformers' config classes
# drop the fields, and llama.cpp's converter reads scoring_func (softmax gating without it).
_SIGMOID_ROUTING = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
_CONFIG_EXTRAS = {
    "kimi_k2": _SIGMOID_ROUTING,
    "glm5": _SIGMOID_ROUTING,
    "kimi_linear": {"moe_router_activation_func": "sigmoid"},
}
_CONVERT_TIMEOUT_S = 3 * 3600
# llama.cpp converts these families, to GGUF architectures Resident's GGUF reader does not
# take (glm-dsa, kimi-linear): Resident reads their checkpoint folder instead.
_GGUF_NOT_READ_BY_RESIDENT = ("glm5", "kimi_linear")


def default_workdir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "resident" / "bench-families"


@dataclass(frozen=True)
class LlamaCpp:
    """llama.cpp's source folder: the converter at its top, binaries in build/bin."""

    root: Path

    def binary(self, name: str) -> Path:
        return self.root / "build" / "bin" / name

    def lacking(self, names: tuple[str, ...]) -> list[str]:
        return [name for name in names if not self.binary(name).is_file()]

    def version(self) -> str | None:
        try:
            done = subprocess.run(
                [str(self.binary("llama-bench")), "--version"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = (done.stdout + done.stderr).strip().splitlines()
        return lines[0] if lines else None


def locate_llama_cpp(given: str | None) -> tuple[LlamaCpp | None, str | None]:
    """llama.cpp from `--llama-cpp` or RESIDENT_LLAMA_CPP if it can make a Q4_1 GGUF;
    otherwise None and why."""
    given = given or os.environ.get(LLAMA_CPP_ENV)
    if not given:
        return None, f"no llama.cpp given (--llama-cpp DIR or {LLAMA_CPP_ENV})"
    llama_cpp = LlamaCpp(Path(given).expanduser().resolve())
    if not (llama_cpp.root / "convert_hf_to_gguf.py").is_file():
        return None, f"{llama_cpp.root} has no convert_hf_to_gguf.py"
    if not CONVERT_WRAPPER.is_file():
        return None, f"the converter's wrapper {CONVERT_WRAPPER} is not in this checkout"
    if llama_cpp.lacking(("llama-quantize",)):
        return None, f"{llama_cpp.binary('llama-quantize')} is not built"
    return llama_cpp, None


@dataclass
class FamilyFiles:
    family: str
    layers: int | None
    folder: Path
    config: dict
    gguf: Path | None = None
    why_no_gguf: str | None = None

    @property
    def resident_reads_gguf(self) -> bool:
        return self.family not in _GGUF_NOT_READ_BY_RESIDENT

    def routing(self) -> tuple[int, int]:
        """(experts per token, routed experts), whatever the family calls them."""
        config = normalise_keys(self.config)
        return config.get("num_experts_per_tok") or 0, config.get("n_routed_experts") or 0

    def max_context(self) -> int:
        return int(normalise_keys(self.config)["max_position_embeddings"])

    def describe(self) -> dict:
        shapes = parameter_shapes(self.family, self.layers)
        counted = [Held(name, _numel(shape), shape[0]) for name, shape in shapes.items()]
        described = {
            "layers": self.config["num_hidden_layers"],
            "params": sum(h.nbytes for h in counted),
            "active_params": decode_bytes(counted, *self.routing()),
            "checkpoint": str(self.folder),
            "gguf": None,
        }
        if self.gguf is not None:
            described["gguf"] = {
                "path": str(self.gguf),
                "bytes": self.gguf.stat().st_size,
                "tensor_types": gguf_tensor_types(self.gguf),
            }
        else:
            described["why_no_gguf"] = self.why_no_gguf
        return described


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def gguf_tensor_types(path: Path) -> dict[str, int]:
    from gguf import GGUFReader

    counts = Counter(tensor.tensor_type.name for tensor in GGUFReader(str(path)).tensors)
    return dict(sorted(counts.items()))


def _recipe_matches(path: Path, recipe: dict) -> bool:
    try:  # compared as JSON reads it back (tuples become lists)
        return json.loads(path.read_text()) == json.loads(json.dumps(recipe))
    except (OSError, ValueError):
        return False


def _released_fields(family: str, config: dict) -> dict:
    """What the family's released config.json says beside transformers' fields. Kimi
    Linear's release gives its layer plan as 1-based lists in `linear_attn_config`, the
    only spelling llama.cpp's converter reads (the engine and transformers read both)."""
    extras = dict(_CONFIG_EXTRAS.get(family, {}))
    if family == "kimi_linear":
        plan = config["layer_types"]
        extras["linear_attn_config"] = {
            "kda_layers": [i + 1 for i, kind in enumerate(plan) if kind == "linear_attention"],
            "full_attn_layers": [i + 1 for i, kind in enumerate(plan) if kind == "full_attention"],
            "head_dim": config["linear_head_dim"],
            "num_heads": config["linear_num_heads"],
            "short_conv_kernel_size": config["linear_conv_kernel_dim"],
        }
    return extras


def _checkpoint(family: str, layers: int | None, home: Path) -> tuple[Path, dict]:
    transformers_config = realistic_config(family, layers)
    extras = _released_fields(family, transformers_config)
    config = {**transformers_config, **extras}
    saver, _ = _TOKENIZERS[family]
    recipe = {"config": config, "tokenizer": saver.__name__}
    folder = home / "hf"
    if _recipe_matches(folder / "recipe.json", recipe):
        return folder, recipe
    partial = home / "hf.partial"
    for stale in (partial, folder):
        shutil.rmtree(stale, ignore_errors=True)
    write_realistic_checkpoint(partial, family, layers, tokenizer=saver)
    if extras:
        written = json.loads((partial / "config.json").read_text())
        (partial / "config.json").write_text(json.dumps({**written, **extras}))
    (partial / "recipe.json").write_text(json.dumps(recipe, indent=2))
    partial.rename(folder)
    return folder, recipe


def _run(what: str, command: list[str], env: dict | None = None) -> None:
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=_CONVERT_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr[-3000:]}")


def _gguf(
    family: str, folder: Path, checkpoint: dict, llama_cpp: LlamaCpp, threads: int, quant: str
) -> Path:
    """llama.cpp's GGUF of `folder` in `quant` (module docstring), made once per recipe."""
    out = folder.parent / f"model-{quant}.gguf"
    options = QUANTIZE_OPTIONS[quant]
    recipe = {
        "checkpoint": checkpoint,
        "llama_cpp": str(llama_cpp.root),
        "version": llama_cpp.version(),
        "quantize": [*options, quant],
    }
    recipe_path = out.with_suffix(".json")
    if out.is_file() and _recipe_matches(recipe_path, recipe):
        return out
    f32 = folder.parent / "model-F32.gguf.partial"
    partial = out.with_name(out.name + ".partial")
    _, pre = _TOKENIZERS[family]
    env = {**os.environ, "PYTHONPATH": str(llama_cpp.root / "gguf-py"), "OMP_NUM_THREADS": "1"}
    try:
        _run(
            "convert_hf_to_gguf.py",
            [sys.executable, str(CONVERT_WRAPPER), str(llama_cpp.root), pre, str(folder)]
            + ["--outtype", "f32", "--outfile", str(f32)],
            env,
        )
        quantize = str(llama_cpp.binary("llama-quantize"))
        _run(
            "llama-quantize",
            [quantize, *options, str(f32), str(partial), quant, str(threads)],
        )
        partial.rename(out)
    finally:
        f32.unlink(missing_ok=True)  # a full-size F32 file is 4x the checkpoint's Q4_1 size
        partial.unlink(missing_ok=True)
    recipe_path.write_text(json.dumps(recipe, indent=2))
    return out


def prepare_family(
    family: str,
    layers: int | None,
    workdir: Path,
    llama_cpp: LlamaCpp | None,
    why_no_llama_cpp: str | None,
    threads: int,
    quant: str = QUANT,
) -> FamilyFiles:
    """The family's checkpoint, and its GGUF when llama.cpp can make it (else why not)."""
    home = workdir / f"{family}-{'full' if layers is None else f'{layers}-layers'}"
    home.mkdir(parents=True, exist_ok=True)
    folder, recipe = _checkpoint(family, layers, home)
    files = FamilyFiles(family, layers, folder, recipe["config"], why_no_gguf=why_no_llama_cpp)
    if llama_cpp is not None:
        try:
            files.gguf = _gguf(family, folder, recipe, llama_cpp, threads, quant)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
            files.why_no_gguf = f"conversion failed: {err}"
    return files
