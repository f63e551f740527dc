"""The worker processes of a tensor-parallel engine (docs/DISTRIBUTED.md).

launch.py starts and stops a node's ranks and joins the process group;
worker.py is a worker rank's loop; executor.py runs each step on every rank
(rank 0's side); step.py is what rank 0 sends each step. The group's
collectives, which the layers call, are engine/collectives.
"""
