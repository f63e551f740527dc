"""The pieces of engine.sampling.sampler, each batched over rows and run where the logits are:
penalties.py (repetition, presence, frequency), filters.py (temperature, top-k,
top-p, min-p), draw.py (one token per row from one host uniform per row)."""
