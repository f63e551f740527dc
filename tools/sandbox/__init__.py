"""The OS sandbox every shell command runs in.

What tools say about it (grants.py), bubblewrap (bubblewrap.py) and what it mounts (mounts.py).
"""
