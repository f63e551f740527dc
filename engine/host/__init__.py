"""What the host machine offers the engine: usable cores, the compute-thread policy,
and the CPU's matrix instructions."""
