"""The small pieces every supervisor of a process group needs: signal the group, ask
whether the leader exited without reaping it, read what a non-blocking pipe holds.

Shared by the shell tool's runner (run.py) and the agent's hook runner, which
supervise their processes differently (one output, or stdin and two outputs)
but must signal and poll them the same way.
"""

from __future__ import annotations

import os
import subprocess

from tools.process.output_cap import HeadTailBuffer


def signal_group(pgid: int, sig: int) -> bool:
    """Signal every process of the group; False when it is gone (or not ours)."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def leader_exited(process: subprocess.Popen) -> bool:
    """Whether the leader has exited, without reaping it (WNOWAIT): an unreaped
    leader keeps its process group id reserved, so the group can still be signalled."""
    if process.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def read_available(
    stream, buffer: HeadTailBuffer, max_chunks: int = 64, chunk_bytes: int = 1 << 16
) -> bool:
    """Read what the non-blocking pipe holds now into `buffer` (bounded, so a flood
    cannot starve the timeout checks); False at end of file."""
    for _ in range(max_chunks):
        try:
            chunk = os.read(stream.fileno(), chunk_bytes)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        buffer.feed(chunk)
    return True
