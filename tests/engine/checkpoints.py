"""Tiny random checkpoints built with transformers' own classes, saved like real ones.

Tests compare the engine against transformers' implementation on these, so the
reference is independent of the code under test.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "import os\nimport sys\nprint(sys.argv)\n",
    "Resident keeps a whole repository in context. 0123456789",
]


def save_tokenizer(directory: Path, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a tiny corpus, with ChatML specials."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(directory))
    return fast


def save_model(model, directory: Path, shard_size: str | None = "200KB") -> Path:
    """Save weights as safetensors (sharded when shard_size is given) plus a tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(str(directory), **kwargs)
    save_tokenizer(directory, model.config.vocab_size)
    return directory


def tiny_llama(directory: Path, seed: int = 0, **overrides) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    params = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=2,
        bos_token_id=0,
    )
    params.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**params)).eval()
    return save_model(model, directory)


def tiny_qwen2(directory: Path, seed: int = 0) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=2,
    )
    model = Qwen2ForCausalLM(config).eval()
    # Random init leaves q/k/v biases at zero; make them matter.
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return save_model(model, directory)


def tiny_glm4(directory: Path, seed: int = 0) -> Path:
    from transformers import Glm4Config, Glm4ForCausalLM

    torch.manual_seed(seed)
    config = Glm4Config(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        attention_bias=True,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Glm4ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
            for norm in (layer.post_self_attn_layernorm, layer.post_mlp_layernorm):
                norm.weight.normal_(1.0, 0.2)
    return save_model(model, directory)


def reference_logits(directory: Path, token_ids: list[int], dtype=torch.float32) -> torch.Tensor:
    """transformers' logits for one sequence: [len, vocab] float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).eval()
    with torch.no_grad():
        out = model(torch.tensor([token_ids])).logits[0]
    return out.float()


def reference_greedy(directory: Path, token_ids: list[int], max_new: int, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([token_ids]),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(token_ids) :].tolist()
