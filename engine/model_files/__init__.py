"""Model folders on disk: where they live, how a GGUF becomes one, what config.json says.

store.py resolves a `--model` value to a folder (converting a GGUF once with
gguf_convert.py), model_config.py reads config.json into the engine's facts.
Building the model and reading its weights is engine/models/loader.py.
"""
