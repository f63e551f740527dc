"""Speculative decoding: proposers draft tokens, one forward pass verifies them.

`proposer.py` is the interface a drafter implements, `prompt_lookup.py` drafts by
copying from the sequence's own context, `mtp_proposer.py` with the checkpoint's
multi-token-prediction layers (DeepSeek V3/V3.2, Kimi K2.x, GLM-4.5+, GLM-5.x),
from the target's hidden states after each step, `verifier.py` decides which drafted
tokens the target model agrees with, `adaptive.py` sizes drafts per sequence
and `speculator.py` ties them together for the scheduler and the engine.
"""

from engine.speculative.speculator import Speculator

__all__ = ["Speculator"]
