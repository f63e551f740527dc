"""What a request is: what it asks (params.py, SamplingParams), its state as the
scheduler and runner see it (sequence.py), and what it returns (outputs.py).
"""
