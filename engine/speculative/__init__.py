"""Speculative decoding: proposers draft tokens, one forward pass verifies them.

`proposer.py` is the interface a drafter implements (prompt lookup today; a
draft model or a model's MTP layers later), `prompt_lookup.py` drafts by
copying from the sequence's own context, `verifier.py` decides which drafted
tokens the target model agrees with, `adaptive.py` sizes drafts per sequence
and `speculator.py` ties them together for the scheduler and the engine.
"""

from engine.speculative.speculator import Speculator

__all__ = ["Speculator"]
