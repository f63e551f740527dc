"""The tensor-parallel group this process belongs to, and the collectives the
layers call (parallel.py: rank, size, all-reduce, gather); agreement.py checks
that every rank holds the same facts. The worker processes themselves are
engine/distributed.
"""
