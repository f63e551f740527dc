"""Child processes: a process group with a timeout and an off switch, limits, environments, capped output."""
