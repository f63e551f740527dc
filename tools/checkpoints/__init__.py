"""Checkpoints of the workspace that `/undo` brings back: store.py picks git refs (git_refs.py) or copies (copies.py)."""
