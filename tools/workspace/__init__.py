"""Where the tools may act: the workspace's confinement and how its files are found.

paths.py resolves and confines every path, safe_fs.py does file operations a
late symlink cannot redirect, bounded_read.py reads a file someone else shaped
(regular files only, never more than a cap), walk.py lists the project's files
honouring ignore rules (ignore.py, globbing.py).
"""
