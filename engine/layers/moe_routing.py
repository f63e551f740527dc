"""Which experts each token goes to, and with what weight: MoE routing as DeepSeek V3 and GLM-4.5 do it.

Scoring: a router matrix gives one logit per expert; `sigmoid` (DeepSeek V3,
Kimi K2, GLM-4.5) or `softmax` (DeepSeek V2 style) turns them into scores.
Selection: with `noaux_tc` a learned per-expert bias (`e_score_correction_bias`)
is added to the scores for choosing only; the weights still come from the
unbiased scores. Grouped top-k first keeps the `topk_group` best of `n_group`
equal-sized expert groups (a group ranks by the sum of its two best scores for
`noaux_tc`, by its best score for `group_limited_greedy`), then picks the
top-k experts inside them. Weights: optionally renormalised to sum to one
(`norm_topk_prob`), then multiplied by `routed_scaling_factor`.

transformers does not validate the grouping; a config whose groups cannot hold
top-k experts silently routes to -inf scores there. We refuse it up front.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import CheckpointError, UnsupportedModelError

SCORING_FUNCTIONS = ("sigmoid", "softmax")
# topk_method -> how an expert group is ranked before the per-expert top-k
GROUP_RANKINGS = {"noaux_tc": "top2_sum", "group_limited_greedy": "max", "greedy": "none"}


@dataclass(frozen=True)
class RoutingConfig:
    num_experts: int
    top_k: int
    num_groups: int = 1
    top_groups: int = 1
    scoring: str = "sigmoid"
    group_ranking: str = "top2_sum"  # "top2_sum", "max" or "none"
    correction_bias: bool = True
    normalize: bool = True
    scaling: float = 1.0

    @property
    def experts_per_group(self) -> int:
        return self.num_experts // self.num_groups

    @property
    def grouped(self) -> bool:
        return self.group_ranking != "none" and self.num_groups > 1

    @classmethod
    def from_config(cls, raw: dict) -> RoutingConfig:
        """Read and validate the routing fields of a DeepSeek V3 / GLM-4.5 style config dict."""
        scoring = raw.get("scoring_func") or "sigmoid"
        if scoring not in SCORING_FUNCTIONS:
            raise UnsupportedModelError(
                f"config.json scoring_func={scoring!r} is not supported; "
                f"supported: {', '.join(SCORING_FUNCTIONS)}"
            )
        method = raw.get("topk_method") or "noaux_tc"
        if method not in GROUP_RANKINGS:
            raise UnsupportedModelError(
                f"config.json topk_method={method!r} is not supported; "
                f"supported: {', '.join(GROUP_RANKINGS)}"
            )
        for key in ("n_routed_experts", "num_experts_per_tok"):
            if not raw.get(key):
                raise CheckpointError(f"config.json has no '{key}', which an MoE model needs")
        routing = cls(
            num_experts=int(raw["n_routed_experts"]),
            top_k=int(raw["num_experts_per_tok"]),
            num_groups=int(raw.get("n_group") or 1),
            top_groups=int(raw.get("topk_group") or 1),
            scoring=scoring,
            group_ranking=GROUP_RANKINGS[method],
            correction_bias=method == "noaux_tc",
            normalize=bool(raw.get("norm_topk_prob", True)),
            scaling=float(raw.get("routed_scaling_factor") or 1.0),
        )
        routing.validate()
        return routing

    def validate(self) -> None:
        """Refuse groupings that cannot route: every message names the config fields to fix."""
        e, k, g, tg = self.num_experts, self.top_k, self.num_groups, self.top_groups
        if not 1 <= k <= e:
            raise CheckpointError(
                f"num_experts_per_tok={k} must be between 1 and n_routed_experts={e}"
            )
        if self.group_ranking == "none":
            return
        if g < 1 or e % g:
            raise CheckpointError(
                f"n_routed_experts={e} is not divisible by n_group={g}; "
                "grouped routing needs equal-sized expert groups"
            )
        if not 1 <= tg <= g:
            raise CheckpointError(f"topk_group={tg} must be between 1 and n_group={g}")
        if self.group_ranking == "top2_sum" and g > 1 and self.experts_per_group < 2:
            raise CheckpointError(
                f"n_group={g} leaves {self.experts_per_group} expert per group, but groups are "
                "ranked by the sum of their two best experts; use fewer groups"
            )
        if tg * self.experts_per_group < k:
            raise CheckpointError(
                f"topk_group={tg} groups of {self.experts_per_group} experts "
                f"(n_routed_experts={e} / n_group={g}) hold fewer than "
                f"num_experts_per_tok={k} experts; raise topk_group or lower n_group"
            )


def route(
    router_logits: torch.Tensor, routing: RoutingConfig, correction_bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 router logits [T, E] -> (weights [T, k] float32, expert ids [T, k])."""
    if routing.scoring == "sigmoid":
        scores = router_logits.sigmoid()
    else:
        scores = router_logits.softmax(dim=-1)
    choice = scores + correction_bias if correction_bias is not None else scores
    if routing.grouped:
        choice = _mask_losing_groups(choice, routing)
    expert_ids = torch.topk(choice, routing.top_k, dim=-1).indices
    weights = scores.gather(1, expert_ids)
    if routing.normalize:
        # The epsilon keeps an all-zero row finite, as the reference does.
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routing.scaling, expert_ids


def _mask_losing_groups(choice: torch.Tensor, routing: RoutingConfig) -> torch.Tensor:
    """Set the scores of experts outside the `top_groups` best groups to -inf."""
    tokens = choice.shape[0]
    grouped = choice.view(tokens, routing.num_groups, routing.experts_per_group)
    if routing.group_ranking == "top2_sum":
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    else:
        group_scores = grouped.amax(dim=-1)
    best_groups = torch.topk(group_scores, routing.top_groups, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, -1)
