"""Model folders on disk: where they live, how a GGUF becomes one, what config.json says.

store.py resolves a `--model` value to a folder (converting a GGUF once with
gguf_convert.py), model_config.py reads config.json into the engine's facts.
A GGUF file is read as a Hugging Face model by gguf_families.py (and
gguf_moe.py): its config.json and, per tensor, the plan of GGUF rows it is
made of (gguf_plan.py); gguf_tokenizer.py rebuilds its vocabulary.
Building the model and reading its weights is engine/models/loader.py.
"""
