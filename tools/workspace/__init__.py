"""Where the tools may act: the workspace's confinement and how its files are found.

paths.py resolves and confines every path, safe_fs.py does file operations a
late symlink cannot redirect, walk.py lists the project's files honouring
ignore rules (ignore.py, globbing.py).
"""
