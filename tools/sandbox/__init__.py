"""The OS sandbox every shell command runs in: bubblewrap (bubblewrap.py) and what it mounts (mounts.py)."""
