"""The traffic `resident bench routing` replays, and the arithmetic of what it measured.

Agent-shaped traffic (issue 40): several repositories, each a long shared
prefix (the system message: a snapshot of the repository's files, 1,000-2,000
tokens by default); several sessions per repository, each a few turns whose
prompt extends the session's own previous prompt (the previous question and a
scripted answer, then the next question), as the agent's turn loop does; and
every request carrying its repository's routing key in the headers the agent
sends (agent/core/clients/http.py SESSION_HEADERS and repository_key:
vllm-router's consistent_hash hashes X-Session-Id, sglang-router's manual policy
X-SMG-Routing-Key).

Everything is drawn from one seeded generator and sized with the model's own
tokenizer, so every policy replays the same requests. Answers are scripted
rather than the model's (the model's text would differ between runs, and a
random test checkpoint's would be noise), so turn k+1's prompt extends turn
k's whatever the replica generated.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

# The headers the agent's HTTP client sends its routing key in (engine imports nothing
# from agent: tests/engine/test_bench_routing.py checks they match).
SESSION_HEADERS = ("X-Session-Id", "X-SMG-Routing-Key")
MESSAGE_OVERHEAD_TOKENS = 8  # a chat template's role markers per message, at most

_SYLLABLES = (
    "ra", "to", "mi", "ven", "sel", "dor", "pak", "lin", "qua", "bex", "cor", "fen",
    "gal", "hix", "jut", "kel", "mor", "nap", "ost", "pid", "rum", "sav", "tek", "ulm",
)  # fmt: skip
_VERBS = ("rename", "document", "test", "speed up", "fix", "split", "inline", "type")


def approximate_tokens(text: str) -> int:
    """Without the model's tokenizer: about four characters a token."""
    return max(1, len(text) // 4)


@dataclass(frozen=True)
class TrafficShape:
    repositories: int = 4
    sessions_per_repository: int = 3
    turns: int = 4
    repository_tokens: tuple[int, int] = (1000, 2000)  # each repository's, drawn in this range
    turn_tokens: int = 120  # a turn's question plus its scripted answer
    seed: int = 40

    def __post_init__(self) -> None:
        low, high = self.repository_tokens
        if min(self.repositories, self.sessions_per_repository, self.turns) < 1:
            raise ValueError("repositories, sessions and turns must each be at least 1")
        if not 1 <= low <= high:
            raise ValueError(f"repository tokens {low}-{high}: need 1 <= low <= high")
        if self.turn_tokens < 8:
            raise ValueError("turn tokens must be at least 8")


@dataclass
class Session:
    key: str  # the routing key, as the agent sends it: its repository's (repo-hex24)
    repository: int
    requests: list[list[dict]] = field(default_factory=list)  # each turn's messages
    approx_tokens: list[int] = field(default_factory=list)  # each turn's prompt, estimated
    prompt_ids: list[list[int]] = field(default_factory=list)  # each turn's, when tokenized

    @property
    def headers(self) -> dict[str, str]:
        return {name: self.key for name in SESSION_HEADERS}


@dataclass
class Traffic:
    shape: TrafficShape
    repository_tokens: list[int]  # each repository's system message, tokenized
    sessions: list[Session]  # in the order they start

    @property
    def requests(self) -> int:
        return sum(len(s.requests) for s in self.sessions)

    @property
    def longest_prompt_tokens(self) -> int:
        return max(max(s.approx_tokens) for s in self.sessions)

    @property
    def working_set_tokens(self) -> int:
        """What one replica would need to keep every repository and every session's
        last prompt cached: the repositories once, each session's own turns once."""
        own = sum(s.approx_tokens[-1] - self.repository_tokens[s.repository] for s in self.sessions)
        return sum(self.repository_tokens) + own

    def best_hit_rate(self, page_size: int) -> float | None:
        """The hit rate if every full page of every prompt were computed once and found
        cached ever after (one replica with room for everything), None untokenized."""
        prompts = [ids for session in self.sessions for ids in session.prompt_ids]
        return best_hit_rate(prompts, page_size) if prompts else None

    def describe(self) -> dict:
        shape = self.shape
        return {
            "repositories": shape.repositories,
            "sessions_per_repository": shape.sessions_per_repository,
            "turns": shape.turns,
            "requests": self.requests,
            "repository_tokens": self.repository_tokens,
            "turn_tokens": shape.turn_tokens,
            "longest_prompt_tokens": self.longest_prompt_tokens,
            "working_set_tokens": self.working_set_tokens,
            "session_headers": list(SESSION_HEADERS),
            "seed": shape.seed,
        }


def _identifier(rng: random.Random) -> str:
    words = ("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(2))
    return "_".join(words)


def _source_lines(rng: random.Random, repository: int) -> Iterator[str]:
    """A repository's files, line by line, without end."""
    while True:
        yield f"# file: repo{repository}/src/{_identifier(rng)}.py"
        yield f"import {_identifier(rng)}"
        for _ in range(rng.randint(2, 4)):
            name, a, b, c = (_identifier(rng) for _ in range(4))
            yield ""
            yield f"def {name}({a}, {b}):"
            yield f'    """{rng.choice(_VERBS).capitalize()} {a} against {b}."""'
            yield f"    {c} = {a} * {rng.randint(2, 997)} + {b}"
            yield f"    return {c} % {rng.randint(3, 97)}"
        yield ""


def _sized(count: Callable[[str], int], target: int, pieces: Iterator[str]) -> str:
    """Pieces joined by newlines until the text reaches `target` tokens."""
    parts, tokens = [], 0
    while tokens < target:
        parts.append(next(pieces))
        tokens += count(parts[-1] + "\n")
    return "\n".join(parts)


def _words(rng: random.Random) -> Iterator[str]:
    while True:
        yield from (
            rng.choice(_VERBS).capitalize(),
            _identifier(rng),
            "in",
            f"{_identifier(rng)}.py",
        )
        yield from ("and", "keep", _identifier(rng), "working.")


def make_traffic(
    shape: TrafficShape,
    count: Callable[[str], int] = approximate_tokens,
    tokenize: Callable[[list[dict]], list[int]] | None = None,
) -> Traffic:
    """The sessions to replay, in the order they start (shuffled: repositories mixed).
    `count` sizes text in tokens; `tokenize`, when given, gives a request's prompt ids (the
    chat template applied), else its size is the messages' tokens plus a template's."""
    rng = random.Random(shape.seed)
    systems, repository_tokens = [], []
    for repository in range(shape.repositories):
        target = rng.randint(*shape.repository_tokens)
        files = _sized(count, target, _source_lines(rng, repository))
        systems.append(
            f"You are a coding agent. The repository repo{repository}, resident in full:\n{files}"
        )
        repository_tokens.append(count(systems[-1]) + MESSAGE_OVERHEAD_TOKENS)
    keys = [f"repo-{rng.getrandbits(96):024x}" for _ in range(shape.repositories)]
    sessions = []
    for repository in range(shape.repositories):
        for _ in range(shape.sessions_per_repository):
            session = Session(keys[repository], repository)
            messages = [{"role": "system", "content": systems[repository]}]
            tokens = repository_tokens[repository]
            half = shape.turn_tokens // 2
            for _ in range(shape.turns):
                question = _sized(count, half, _words(rng)).replace("\n", " ")
                messages = [*messages, {"role": "user", "content": question}]
                tokens += count(question) + MESSAGE_OVERHEAD_TOKENS
                session.requests.append(messages)
                if tokenize is not None:
                    session.prompt_ids.append(tokenize(messages))
                session.approx_tokens.append(len(session.prompt_ids[-1]) if tokenize else tokens)
                answer = _sized(count, shape.turn_tokens - half, _words(rng)).replace("\n", " ")
                messages = [*messages, {"role": "assistant", "content": answer}]
                tokens += count(answer) + MESSAGE_OVERHEAD_TOKENS
            sessions.append(session)
    rng.shuffle(sessions)
    return Traffic(shape, repository_tokens, sessions)


def best_hit_rate(prompts: list[list[int]], page_size: int) -> float:
    """Cached share of all prompt tokens when each distinct full page (with everything
    before it) is computed once: sum over prompts of their pages already seen. Which
    prompt comes first changes nothing: each distinct page is new exactly once."""
    seen: set[int] = set()
    cached = 0
    for ids in prompts:
        chain = 0
        for start in range(0, len(ids) - page_size + 1, page_size):
            chain = hash((chain, tuple(ids[start : start + page_size])))
            if chain in seen:
                cached += page_size
            else:
                seen.add(chain)
    total = sum(len(ids) for ids in prompts)
    return cached / total if total else 0.0


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0-100) of `values`, None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def cached_tokens(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def summarize(records: list[dict]) -> dict:
    """A policy's figures from its requests' records (prompt_tokens, cached_tokens, ttft_s):
    the hit rate is the cached share of all prompt tokens, prefill what was computed."""
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    ttfts = [r["ttft_s"] for r in records]
    return {
        "requests": len(records),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens": prompt - cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
    }


def over_baseline(policies: dict[str, dict], baseline: str = "round_robin") -> None:
    """Each policy's hit rate and prefill tokens as multiples of `baseline`'s, in place
    (None without it)."""
    for key in ("hit_rate", "prefill_tokens"):
        base = policies.get(baseline, {}).get(key)
        for figures in policies.values():
            value = figures.get(key)
            figures[f"{key}_over_{baseline}"] = value / base if base and value is not None else None
