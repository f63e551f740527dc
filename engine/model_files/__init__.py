"""Model folders on disk: where they live, how a GGUF becomes one, how one is read.

store.py resolves a `--model` value to a folder (converting a GGUF once with
gguf_convert.py), model_config.py reads config.json into the engine's facts,
and loader.py reads the weights.
"""
