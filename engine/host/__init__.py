"""What the host machine offers the engine: usable cores, the compute-thread policy,
the CPU's matrix instructions, advice to its memory manager, and the cache folder."""
