"""EAGLE speculative decoding: the draft tree SGLang verifies and its acceptance (pure).

    t_cycle = S·t_draft + t_verify,  t_verify = t_step(bs·D) with α + (α_verify − α_NCCL)
    q_1 = a_j, q_i = (1-a_j)·c·(1-r)·r^(i-2)  (rank-i candidate is the target's token)
    tree = SGLang's beam (width topk, depth S) pruned to the D-1 highest path scores Π q
    τ = 1 + Σ_{kept nodes} Π q  (chain, topk = 1: 1 + Σ_{i≤S} Π_{j≤i} a_j)
    tok/s per request = τ / t_cycle

(S = num_steps, D = num_draft_tokens, a_j = top-1 acceptance at position j.)
"""

from __future__ import annotations

from tasks.emulator.physics import model_params

# Rank-mass shape of the draft's candidates (see ``rank_probs``). [A] c = 0.6, r = 0.5:
# chosen within the region that reproduces SGLang's EAGLE-3 tree acceptance on Llama-3.1-8B
# (4.68 at num_steps 5, 5.39 at num_steps 8, topk 8 / 64 draft tokens; sgl-project/sglang
# PR #4247, config as in PR #4716) from a chain top-1 rate a ~= 0.8 (derived from the chain-of-3
# 2.36x in SGLang's speculative_decoding docs): this (c, r) gives 4.61 / 5.48 (-1.5 % / +1.7 %).
# See docs/emulator.md "Tree acceptance" for the fit and its sensitivity.
DEFAULT_TOPK_RECOVERY = 0.6
DEFAULT_TOPK_DECAY = 0.5


def acceptance_rates(profile: dict, steps: int) -> list[float]:
    """Per-position top-1 acceptance a_1..a_steps (scalar repeated, list extended with its last)."""
    a = model_params(profile)["accept_rate"]
    rates = list(a) if isinstance(a, list) else [float(a)]
    while len(rates) < steps:
        rates.append(rates[-1])
    return [float(r) for r in rates[:steps]]


def rank_probs(a: float, topk: int, c: float = DEFAULT_TOPK_RECOVERY, r: float = DEFAULT_TOPK_DECAY) -> list[float]:
    """Probability that the target's token is the draft's rank-i candidate, i = 1..topk.

    q_1 = a (the top-1 acceptance rate); q_i = (1 - a)·c·(1 - r)·r^(i-2) for i >= 2, so the
    top-k coverage is p_k = Σ q_i = a + (1 - a)·c·(1 - r^(k-1)) <= a + (1 - a)·c <= 1:
    the lower-ranked candidates share the fraction c of the top-1 misses, geometrically
    decaying by r per rank (the probability mass of a draft is concentrated on its top-1).

    Args:
        a: top-1 acceptance in [0, 1).
        topk: candidates per node (>= 1).
        c: share of the top-1 misses recoverable by lower ranks, in [0, 1] [A].
        r: rank-to-rank decay, in [0, 1) [A].
    A draft ranks its candidates by its own probability and is taken as calibrated, so a
    rank-2 token is never likelier than the top-1: c is capped at a / ((1 - a)(1 - r)) (binds
    only for a < c(1 - r) / (1 + c(1 - r)), 0.23 at the shipped c, r).

    Returns:
        list of ``topk`` probabilities, non-increasing in rank, summing to <= 1.
    Raises:
        ValueError: r >= 1.
    """
    if r >= 1.0:
        raise ValueError(f"rank decay r must be < 1 (got {r})")
    c_eff = min(c, a / ((1.0 - a) * (1.0 - r))) if a < 1.0 else 0.0
    return [a] + [(1.0 - a) * c_eff * (1.0 - r) * r ** (i - 2) for i in range(2, topk + 1)]


def _rank_shape(profile: dict) -> tuple[float, float]:
    me = model_params(profile)
    return (float(me.get("accept_topk_recovery", DEFAULT_TOPK_RECOVERY)),
            float(me.get("accept_topk_decay", DEFAULT_TOPK_DECAY)))


def draft_tree(profile: dict, steps: int, topk: int, draft_tokens: int) -> list[tuple[int, float]]:
    """The draft tree SGLang's EAGLE worker verifies, as (depth, reach probability) per node.

    SGLang (eagle_utils / ``organize_draft_results``): step 1 proposes the draft's top-k
    tokens; every later step expands each of the ``topk`` best nodes of the previous depth
    (the beam) by its top-k children (topk² candidates per depth); at the end the
    ``draft_tokens - 1`` candidates with the highest path scores are kept (plus the root).
    The draft's scores are taken as calibrated: a node's score is the probability that the
    target's greedy path passes through it, Π_j q_{rank_j}(a_j) (``rank_probs``, positions
    independent) [A]. Kept sets are prefix-closed (a child scores below its parent).

    Returns:
        list of (depth 1..steps, probability) for the kept nodes, best first; at most
        ``draft_tokens - 1`` entries.
    """
    c, r = _rank_shape(profile)
    rates = acceptance_rates(profile, steps)
    cands: list[tuple[float, int]] = []
    beam = [1.0]
    for d in range(1, steps + 1):
        q = rank_probs(rates[d - 1], max(1, topk), c, r)
        level = sorted((p * qi for p in beam for qi in q), reverse=True)
        cands += [(p, d) for p in level]
        beam = level[:max(1, topk)]
    cands.sort(key=lambda x: (-x[0], x[1]))
    return [(d, p) for p, d in cands[:max(0, draft_tokens - 1)]]


def position_probs(profile: dict, steps: int, topk: int, draft_tokens: int) -> list[float]:
    """Conditional acceptance per depth: P(L >= d+1 | L >= d) over the kept draft tree.

    reach(d) = Σ of the reach probabilities of the kept nodes at depth d (the target's path
    meets at most one node per depth, so these are disjoint events); the entries are
    reach(d) / reach(d - 1), d = 1..deepest kept depth. A chain (topk = 1) gives a_d.
    """
    reach = [1.0] + [0.0] * steps
    for d, p in draft_tree(profile, steps, topk, draft_tokens):
        reach[d] += p
    out = []
    for d in range(1, steps + 1):
        if reach[d] <= 0.0:
            break
        out.append(min(1.0, reach[d] / reach[d - 1]))
    return out


def tau(profile: dict, steps: int, topk: int, draft_tokens: int) -> float:
    """Mean accepted tokens per verify (incl. the bonus token): 1 + Σ over kept nodes of
    their reach probability (= 1 + Σ_d reach(d)); <= min(draft_tokens, steps + 1)."""
    return 1.0 + sum(p for _, p in draft_tree(profile, steps, topk, draft_tokens))


def tau_independent(profile: dict, steps: int, topk: int, draft_tokens: int) -> float:
    """A simpler heuristic the tests compare the tree against (an upper bound on ``tau``):
    every depth up to min(S, D-1) accepted with 1 - (1 - a)^topk (topk independent draws at
    the top-1 rate, no node budget)."""
    total, prod = 1.0, 1.0
    for a in acceptance_rates(profile, steps)[:max(0, min(steps, draft_tokens - 1))]:
        prod *= 1.0 - (1.0 - a) ** max(1, topk)
        total += prod
    return total


def accepted_from_uniform(probs: list[float], u: float) -> int:
    """Inverse-CDF draw of the accepted length (1..len(probs)+1) from one uniform ``u``."""
    surv = 1.0
    for i, p in enumerate(probs):
        nxt = surv * p  # P(L >= i + 2)
        if u >= nxt:
            return i + 1
        surv = nxt
    return len(probs) + 1
