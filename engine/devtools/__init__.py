"""What developers run against the engine, kept apart from what serves requests.

- `testing/`: tiny checkpoints in real releases' on-disk forms, tokenizers and
  chat templates, traffic and hazard checkers, for tests and benchmarks;
- `kernel_check/`: `python -m engine.devtools.kernel_check`, every Triton
  kernel compiled for Hopper (and Blackwell) without a GPU.

Nothing on the serving path imports this package (tests/test_layout_rules.py
keeps it so); it imports the runtime freely, as its users do.
"""
