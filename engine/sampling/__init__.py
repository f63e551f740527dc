"""Next tokens from a batch's logits: the sampler (sampler.py) and its pieces, each
batched over rows and run where the logits are: penalties.py (repetition, presence,
frequency), filters.py (temperature, top-k, top-p, min-p), draw.py (one token per
row from one host uniform per row). What a request asks of it is
engine/requests/params.py (SamplingParams)."""
