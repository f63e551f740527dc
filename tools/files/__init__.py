"""The file tools (read, write, edit, list, glob, grep) and what they share.

guard.py refuses stale or unsafe targets, state.py remembers what the agent
last saw of each file, access.py routes reads and writes through an editor
when one drives the agent.
"""
