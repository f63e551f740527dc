"""The long_decode figure of `resident bench families`: what sparse and linear attention buy
at long context (issue 41), Resident alone.

For each context (8k, 16k and 32k tokens by default, `--contexts`), one
sequence's prompt of that length is prefilled untimed, then `new`
single-token decode steps are timed, as the long_context figure does at 8k.
Beside the rate, what one sequence of that context holds: its KV (the
engine's own bytes per token, in its KV dtype: the MLA latent, plus GLM-5's
indexer keys on the layers that run an indexer) and, for Kimi Linear, its
recurrent state (a fixed size whatever the context).

The three families are measured one after another on the same machine and
shown side by side: `glm5` (sparse attention: each query reads its 2,048
selected positions, though the indexer still scores every one) and
`kimi_linear` (KDA layers keep a state, only a quarter keep KV) against
`kimi_k2`, which has the same MLA and MoE sizes with dense attention. Ratios
are family / kimi_k2 (decode above 1: faster; bytes below 1: smaller).

llama.cpp is not asked for this figure: the comparison is between attention
designs within one engine.
"""

from __future__ import annotations

from engine.devtools.testing.realistic_checkpoints import realistic_config
from engine.model_files.config_aliases import normalise_keys

FIGURE = "long_decode"
DEFAULT_CONTEXTS = (8192, 16384, 32768)
NEW_TOKENS = 64
BASELINE = "kimi_k2"  # dense MLA attention of the same sizes


def sizes(contexts: tuple[int, ...]) -> dict:
    return {"contexts": list(contexts), "new": NEW_TOKENS}


def check_contexts(families: tuple[str, ...], layers: int | None, contexts: tuple[int, ...]):
    """Refuse, before any checkpoint is written, a context the families' configs cannot hold."""
    if not contexts or min(contexts) < 1:
        raise ValueError(f"--contexts: give positive token counts, not {list(contexts)}")
    for family in families:
        limit = int(normalise_keys(realistic_config(family, layers))["max_position_embeddings"])
        if max(contexts) + NEW_TOKENS >= limit:
            raise ValueError(
                f"--contexts: {max(contexts)} tokens plus {NEW_TOKENS} decoded pass {family}'s "
                f"max_position_embeddings of {limit}"
            )


def best(samples: list[dict]) -> dict:
    """Each context's best rate over the rounds, with every round's."""
    if not samples:
        return {}
    by_context = {}
    for context in samples[0]["tok_s"]:
        rates = [sample["tok_s"][context] for sample in samples]
        by_context[context] = {"tok_s": max(rates), "samples": rates}
    return {"new": samples[0]["new"], "by_context": by_context}


def _ratio(ours, theirs) -> float | None:
    return round(ours / theirs, 3) if ours and theirs else None


def compare(result: dict) -> dict:
    """The families side by side (module docstring), from what each has measured so far."""
    families = {}
    for family, measured in result["families"].items():
        resident = measured["resident"]
        figure = resident.get(FIGURE)
        if not figure:
            continue
        per_token = resident.get("kv_bytes_per_token")
        state = resident.get("recurrent_state_bytes_per_sequence", 0)
        rows = {}
        for context, measured_context in figure["by_context"].items():
            held = int(context) * per_token + state if per_token is not None else None
            rows[context] = {"tok_s": measured_context["tok_s"], "sequence_bytes": held}
        families[family] = {
            "kv_bytes_per_token": per_token,
            "recurrent_state_bytes_per_sequence": state,
            "by_context": rows,
        }
    baseline = families.get(BASELINE)
    if baseline is not None:
        for rows in families.values():
            for context, row in rows["by_context"].items():
                theirs = baseline["by_context"].get(context, {})
                row[f"tok_s_over_{BASELINE}"] = _ratio(row["tok_s"], theirs.get("tok_s"))
                row[f"sequence_bytes_over_{BASELINE}"] = _ratio(
                    row["sequence_bytes"], theirs.get("sequence_bytes")
                )
    contexts = result["sizes"][FIGURE]["contexts"]
    return {"contexts": contexts, "baseline": BASELINE, "families": families}


def family_lines(measured: dict) -> list[str]:
    """One family's rows for its table: Resident's rate at each context."""
    figure = measured["resident"].get(FIGURE)
    if not figure:
        return []
    return [
        f"  {f'decode after {context} tok/s':26}{row['tok_s']:>12.2f}{'-':>12}{'-':>8}"
        for context, row in figure["by_context"].items()
    ]


def table_lines(comparison: dict) -> list[str]:
    """The side-by-side block: decode rate and the bytes one sequence holds, per context."""
    families = comparison["families"]
    if not families:
        return []
    ratio = f"/{BASELINE}" if BASELINE in families else ""
    lines = [
        "",
        f"long-context decode (Resident alone, 1 sequence; ratios are family / {BASELINE}):",
        f"  {'family':13}{'context':>9}{'tok/s':>10}{ratio or '':>10}"
        f"{'KV+state MiB':>14}{ratio or '':>10}",
    ]
    for family, rows in families.items():
        for context, row in rows["by_context"].items():
            held = row["sequence_bytes"]
            speed = row.get(f"tok_s_over_{BASELINE}")
            size = row.get(f"sequence_bytes_over_{BASELINE}")
            lines.append(
                f"  {family:13}{context:>9}{row['tok_s']:>10.2f}"
                f"{'-' if speed is None else f'{speed:.2f}':>10}"
                f"{'-' if held is None else f'{held / 2**20:.1f}':>14}"
                f"{'-' if size is None else f'{size:.2f}':>10}"
            )
        state = rows["recurrent_state_bytes_per_sequence"]
        lines.append(
            f"  {family}: {rows['kv_bytes_per_token']} KV bytes per token"
            + (f", {state / 2**20:.1f} MiB recurrent state per sequence" if state else "")
        )
    return lines
