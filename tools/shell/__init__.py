"""The `shell` tool and how a command line is read before it runs.

tool.py runs the line; parse.py finds the simple commands it would run,
normalize.py and wrappers.py see past `env`, `xargs` and the like, and
readonly.py (with readonly_git.py) knows which commands only look.
"""
