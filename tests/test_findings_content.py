"""What the findings say: one consistent best (confirmed means, never a draw that did not
hold up), a line for every level that ran and lost, decisive lines verbatim, EAGLE's
break-even acceptance, next steps, the emulated node's label and the deployable command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sweeps.config.spec import load_spec
from sweeps.publish.findings import Context, read_data_block, render_section, update_findings
from sweeps.publish.findings.break_even import FORMULA
from sweeps.publish.findings.evidence import decisive_line
from sweeps.publish.findings.sections import best_section, confirmation_lines
from sweeps.store import records
from tasks.backends import get_backend
from tests.conftest import compose_cfg

FP = {"gpu_arch": "sm_120", "sglang": "0.5.23"}
BASE = {"speculative": "none", "allreduce": "nccl", "nccl_proto": "default", "cuda_graph_max_bs": 512}
SYMM_LOG = """[2026-11-29 15:00:06 TP0] Init torch distributed begin.
[2026-11-29 15:00:09 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "<VENV>/sglang/srt/distributed/device_communicators/symm_mem.py", line 70, in __init__
    if self.world_size not in SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]:
KeyError: 12
[2026-11-29 15:00:09] Received sigquit from a child process. It usually means the child failed.
"""


def rec(n: int, tok: float | None, *, status: str = "ok", baseline: bool = False, itl: float | None = None,
        accept: float = 1.0, log: str = "", cls: str | None = None, sig: str | None = None, **params) -> records.TrialRecord:
    p = {**BASE, **params}
    m = {"decode_tok_s": tok, "accept_length": accept, "itl_ms_p50": itl or (1000 / tok if tok else None),
         "ttft_ms_p50": 80.0} if tok is not None else {}
    return records.TrialRecord(number=n, state="COMPLETE" if status == "ok" else "PRUNED", params=p, status=status,
                         metrics=m, failure_class=cls, failure_kind="deterministic" if cls else None,
                         failure_signature=sig, phase="startup" if cls else None, is_baseline=baseline,
                         launch_command=f"/venv/bin/python -m tasks.emulator.server --trial {n}", log_tail=log,
                         fingerprint=FP, timings={"gpu_s": 80.0})


def entry(trial: int, mean: float, lo: float, hi: float, *, base: bool = False, verdict: str = "") -> dict:
    return {"trial": trial, "n": 3, "mean": mean, "ci_low": lo, "ci_high": hi, "is_baseline": base,
            "tokens_match": None, "verdict": verdict, "label": f"t{trial}", "config": {}}


def sweep() -> list[records.TrialRecord]:
    return [rec(0, 82.5, baseline=True),
            rec(1, 91.6, cuda_graph_max_bs=128),  # the lucky draw: re-measured at 88.6
            rec(2, 90.1, nccl_proto="LL", cuda_graph_max_bs=32),
            rec(3, 55.0, nccl_proto="Simple", cuda_graph_max_bs=32, itl=17.3,
                log="[2026-11-29 15:00:00] env: NCCL_PROTO=Simple\n[2026-11-29 15:00:06 TP0] Init torch distributed begin.\n"),
            rec(4, None, status="failed", allreduce="torch_symm_mem", cls="torch_symm_mem_unsupported",
                sig="KeyError: <N>", log=SYMM_LOG)]


CONF = {"repeats": 3, "confidence": 0.95, "baseline_trial": 0, "winner": 2,
        "entries": [entry(0, 82.0, 78.0, 86.0, base=True), entry(1, 88.6, 83.3, 93.9),
                    entry(2, 89.9, 86.0, 93.9, verdict="winner")],
        "winner_note": "Winner t2: 89.9 tok/s mean over 3 runs. The sweep's single best measurement "
                       "(t1, 91.6 tok/s) did not hold up under repeats."}


def ctx(tmp_path: Path, conf: dict | None = CONF, **kw) -> Context:
    return Context(study="camp", sweep="eagle3_allreduce", fingerprint=FP, baseline_config=dict(BASE),
                   confirmation=conf, now="2026-12-01T00:00:00+00:00",
                   mapping={"torch_symm_mem_unsupported": ["allreduce"]},
                   plots_dir=tmp_path / "store" / "reports" / "camp", findings_path=tmp_path / "findings" / "camp.md",
                   **kw)


def _outside_confirmation(text: str) -> str:
    return re.sub(r"### Confirmation.*?(?=\n### )", "", text, flags=re.S)


def test_one_consistent_best_quotes_confirmed_means(tmp_path):
    text, data = render_section(ctx(tmp_path), sweep())
    assert "**t2: 89.9 tok/s**, **1.10x** the baseline" in text  # the confirmed mean, against the confirmed baseline
    assert "The sweep's single measurement of t2 was 90.1 tok/s." in text
    assert "**82.0 tok/s** — " in text and "confirmed mean of 3 fresh runs, 95 % CI 78.0–86.0" in text
    # the reference moved to the confirmed winner, not to t1's single draw that did not hold up
    assert "The plain-decoding reference moved in this sweep: 82.0 -> 89.9 tok/s" in text
    body = _outside_confirmation(text)
    assert "91.6 tok/s" not in body and "-> 91.6" not in body
    assert "91.6 (t1), confirmed 88.6" in body  # the approaches table says what the draw re-measured at
    assert data["baselines"][-1]["value"] == 82.0 and data["baselines"][-1]["confirmed_runs"] == 3
    assert data["sweeps"][-1]["best_value"] == 89.9


def test_the_plain_reference_is_the_tie_groups_pick_not_its_highest_mean(tmp_path):
    # the fresh user's campaign: t27 had the tie group's highest confirmed mean, the tie-break
    # picked t29 (settings nearer the baseline's); the reference proposed is the pick, at its mean
    conf = {**CONF, "winner": 2, "tie_group": [2, 1],
            "entries": [entry(0, 82.0, 78.0, 86.0, base=True), entry(1, 90.4, 88.0, 92.8, verdict="tie group"),
                        entry(2, 89.9, 86.0, 93.9, verdict="winner")]}
    text, _ = render_section(ctx(tmp_path, conf=conf), sweep())
    line = next(x for x in text.splitlines() if "The plain-decoding reference moved" in x)
    assert "82.0 -> 89.9 tok/s" in line and "(t2, the confirmed winner, picked in its tie group t1, t2)" in line
    assert "nccl_proto default -> LL, cuda_graph_max_bs 512 -> 32" in line
    assert "90.4" not in line and "(t1)" not in line


def test_a_speculative_winner_leaves_the_plain_reference_to_the_best_plain_config(tmp_path):
    recs = [*sweep(), rec(5, 95.0, speculative="eagle3")]
    conf = {**CONF, "winner": 5, "entries": [*CONF["entries"], entry(5, 94.0, 92.0, 96.0, verdict="winner")]}
    text, _ = render_section(ctx(tmp_path, conf=conf), recs)
    line = next(x for x in text.splitlines() if "The plain-decoding reference moved" in x)
    assert "82.0 -> 89.9 tok/s" in line and "(t2)" in line and "confirmed winner" not in line


def test_without_confirmation_values_are_single_measurements(tmp_path):
    text, data = render_section(ctx(tmp_path, conf=None), sweep())
    assert "**t1: 91.6 tok/s**" in text and "not yet confirmed with repeats" in text
    assert "(emulated " not in text and "emulated node" not in text  # a real backend's numbers carry no emulated label
    assert "(measured in this sweep, t0; single measurement)" in text
    # an unconfirmed single measurement is never advised as the next sweep's baseline
    assert "measured 91.6 tok/s once (1.11x the baseline; single measurement, not confirmed)" in text
    assert "It is not advised as `sweep.baseline`" in text and "consider it as `sweep.baseline`" not in text
    assert data["baselines"][-1]["confirmed_runs"] == 0


def test_drift_line_says_how_each_baseline_was_measured(tmp_path):
    _, old = render_section(ctx(tmp_path, conf=None), sweep())
    c2 = ctx(tmp_path)
    c2.study = "camp-2"
    text, _ = render_section(c2, sweep(), old)
    assert "82.5 -> 82.0 tok/s" in text and "82.5: single measurement; 82.0: confirmed mean of 3 fresh runs" in text


def test_every_level_that_ran_and_lost_has_a_line_with_margin_and_reason(tmp_path):
    eagle_only = rec(6, 50.0, accept=2.0, speculative="eagle3", cuda_graph_max_bs=256, eagle_num_steps=3,
                     eagle_topk=1, eagle_num_draft_tokens=4)
    text, _ = render_section(ctx(tmp_path), [*sweep(), eagle_only])
    sec = text.split("### What ran and lost")[1].split("\n### ")[0]
    simple = next(line for line in sec.splitlines() if line.startswith("- `nccl_proto=Simple`"))
    assert "best 55.0 tok/s (t3, single measurement) = 0.61× the best (-34.9 tok/s), 0.67× the baseline (-27.0 tok/s)" in simple
    assert "ITL p50 17.3 ms vs 11.1 ms in t2" in simple
    assert "the server log shows the level in effect: `env: NCCL_PROTO=Simple`" in simple
    symm = next(line for line in sec.splitlines() if line.startswith("- `allreduce=torch_symm_mem`"))
    assert "1 of 1 launches failed: torch_symm_mem_unsupported (t4)" in symm
    # t1 (cuda_graph_max_bs=128) re-measured within noise of the winner: a tie, not listed as a loss
    assert not any(line.startswith("- `cuda_graph_max_bs=128`") for line in sec.splitlines())
    ties = next(line for line in sec.splitlines() if line.startswith("- Not losses: within run-to-run noise"))
    assert "`cuda_graph_max_bs=128` (88.6 tok/s, t1)" in ties and "`nccl_proto=default` (88.6 tok/s, t1)" in ties
    assert not any(line.startswith("- `nccl_proto=LL`") for line in sec.splitlines())  # the winner's level
    share = next(line for line in sec.splitlines() if line.startswith("Share of the decode tok/s variance"))
    assert "(ANOVA main effects" in share and "n=5" in share  # launched ok trials: t0-t3, t6
    assert re.search(r"nccl_proto \d+ %, speculative \d+ %", share)  # the two large effects lead
    g256 = next(line for line in sec.splitlines() if line.startswith("- `cuda_graph_max_bs=256`"))
    assert "ran only with speculative=eagle3: the gap is mostly speculative's" in g256
    spec = next(line for line in sec.splitlines() if line.startswith("- `speculative=eagle3`"))
    assert "ran only with" not in spec and "best 50.0 tok/s (t6, single measurement)" in spec


def test_decisive_line_is_verbatim_not_normalized(tmp_path):
    r = sweep()[4]
    assert decisive_line(r) == "KeyError: 12"
    text, _ = render_section(ctx(tmp_path), sweep())
    assert "decisive line (verbatim): `KeyError: 12`" in text and "KeyError: <N>" not in text
    # without a log tail the stored signature is all there is
    r.log_tail = ""
    assert decisive_line(r) == "KeyError: <N>"


def test_a_dead_end_reads_as_the_rule_it_taught(tmp_path):
    """One failing trial shares every knob with itself: the entry names the rule learned from
    it (what later proposals are skipped by), not the trial's whole config."""
    from sweeps.rules.match import Rule

    recs = [*sweep(), rec(5, None, status="failed", nccl_algo="Tree", nccl_proto="LL", cls="nccl_env_algo_proto_invalid",
                          sig="no algorithm/protocol available")]
    rule = Rule(id=7, fingerprint_hash="h", fingerprint=FP, model=None, knobs={"nccl_algo": "Tree"},
                failure_class="nccl_env_algo_proto_invalid", kind="deterministic", signature="x",
                evidence=[{"sweep": "camp", "trial_number": 5}])
    mapping = {"torch_symm_mem_unsupported": ["allreduce"], "nccl_env_algo_proto_invalid": ["nccl_algo", "nccl_proto"]}
    c = ctx(tmp_path, rules=[rule])
    c.mapping = mapping
    text, _ = render_section(c, recs)
    assert "**nccl_env_algo_proto_invalid** (deterministic, startup) when nccl_algo=Tree (rule 7): t5" in text
    c = ctx(tmp_path)  # no rule learned (a rule store that failed): what the failing trials share
    c.mapping = mapping
    text, _ = render_section(c, recs)
    assert "when nccl_proto=LL, nccl_algo=Tree: t5" in text


def test_break_even_acceptance_next_to_the_measured_one(tmp_path):
    base = rec(0, 1000 / 11.2, baseline=True)  # 11.2 ms per token
    eagle = rec(5, 2.9 * 1000 / 54.0, accept=2.9, speculative="eagle3", eagle_num_steps=3, eagle_topk=1,
                eagle_num_draft_tokens=4)  # a 54 ms verify cycle yielding 2.9 tokens
    text, _ = render_section(ctx(tmp_path, conf=None), [base, eagle])
    assert FORMULA in text
    assert ("EAGLE-3 3/1/4 (t5): acceptance 2.90 measured, 4.82 needed to break even (cycle 54.0 ms vs "
            "11.2 ms/token) — 1.66× short; unreachable with this shape (at most 4 per cycle)") in text
    lost = next(line for line in text.splitlines() if line.startswith("- `speculative=eagle3`"))
    assert "acceptance 2.90 vs 4.82 needed to break even" in lost
    dead = next(line for line in text.splitlines() if "speculative decoding never beat the baseline" in line)
    assert "its verify cycle takes 54.0 ms against 11.2 ms per plain token, so it needs acceptance 4.82 and measured 2.90" in dead


def test_next_steps_ties_rechecks_and_plot_links(tmp_path):
    text, _ = render_section(ctx(tmp_path), sweep())
    sec = text.split("### Next steps")[1]
    assert ("**Ties that need more repeats**: the winner t2 89.9 (86.0–93.9, 3 runs) overlaps "
            "t1 88.6 (83.3–93.9, 3 runs). Re-run") in sec
    assert "sweep.confirm.repeats=6" in sec
    assert "torch_symm_mem_unsupported (t4; after a torch / nccl upgrade)" in sec
    # no node profile to name: a placeholder word a pasted command passes to Hydra, never "<...>"
    assert ("`.venv/bin/python run_sweep.py sweep=recheck source=camp node=NODE`, NODE being the upgraded "
            "node's profile (`conf/node/NODE.yaml`)") in sec and "<" not in sec.split("recheck source=")[1][:40]
    on_node = render_section(ctx(tmp_path, node={"name": "rtx_pro_6000x8"}), sweep())[0].split("### Next steps")[1]
    assert "`.venv/bin/python run_sweep.py sweep=recheck source=camp node=rtx_pro_6000x8_upgraded` (on" in on_node
    # the recheck reads the source study in the store its last run was told (and nothing else of its overrides)
    c = ctx(tmp_path, node={"name": "rtx_pro_6000x8"})
    c.overrides = ["tracking.store_dir=/tmp/st", "sweep.budget.trials=60", "backend=instant"]
    sec = render_section(c, sweep())[0].split("### Next steps")[1]
    assert ("`.venv/bin/python run_sweep.py sweep=recheck source=camp node=rtx_pro_6000x8_upgraded "
            "tracking.store_dir=/tmp/st` (on") in sec
    assert "[optimization_history](../store/reports/camp/optimization_history.png)" in sec
    assert "MLflow parent run" in sec


def test_untried_levels_in_next_steps_and_emulated_label_and_deploy_command(tmp_path):
    spec = load_spec(compose_cfg(["sweep=smoke", f"tracking.store_dir={tmp_path / 'store'}",
                                  f"tracking.findings_dir={tmp_path / 'findings'}"]))
    recs = [rec(0, 82.0, baseline=True, cuda_graph_max_bs=128), rec(1, 88.0, cuda_graph_max_bs=64)]
    for r in recs:
        r.params.pop("nccl_proto")
    text = update_findings(spec, "smoke", recs, FP, None).read_text()
    assert "**Untried levels** (never launched, no known dead end): `allreduce` = custom, flashinfer_fusion; " \
           "`cuda_graph_max_bs` = 512." in text
    best = text.split("### Best config")[1].split("\n### ")[0]
    assert "(emulated 8×RTX PRO 6000 Blackwell node)" in best
    deploy = best.split("```bash\n")[1].split("\n```")[0]
    assert deploy.startswith("python -m sglang.launch_server --model-path ") and "--port 30000" in deploy
    assert "tasks.emulator" not in deploy and "/venv/" not in deploy
    assert "What the sweep launched (emulated 8×RTX PRO 6000 Blackwell node): `/venv/bin/python" in best
    assert "GPU-hours, modelled: emulated node, no real GPU used" in text
    assert "Every measurement below is the emulated 8×RTX PRO 6000 Blackwell node's" in text
    assert read_data_block(text)["sweeps"][-1]["best_trial"] == 1


def test_next_steps_never_suggest_an_approach_a_known_dead_end_excludes(tmp_path):
    from sweeps.rules.match import Rule
    from sweeps.rules.store import fingerprint_hash

    spec = load_spec(compose_cfg(["sweep=smoke"]))
    recs = [rec(0, 82.0, baseline=True, cuda_graph_max_bs=128), rec(1, 88.0, cuda_graph_max_bs=64)]
    for r in recs:
        r.params.pop("nccl_proto")
    rule = Rule(id=2, fingerprint_hash=fingerprint_hash(FP), fingerprint=FP, model=None,
                knobs={"allreduce": "flashinfer_fusion"}, failure_class="flashinfer_allreduce_fusion_unsupported_arch",
                kind="deterministic", signature="x", evidence=[{"sweep": "earlier", "trial_number": 3}])

    def approaches(c):
        text, _ = render_section(c, recs)
        line = next((x for x in text.splitlines() if x.startswith("- **Untried approaches**")), "")
        return line

    without = approaches(ctx(tmp_path, space=spec.space))
    assert "allreduce=flashinfer_fusion" in without and "allreduce=custom" in without
    got = approaches(ctx(tmp_path, space=spec.space, rules=[rule]))
    assert "allreduce=custom" in got and "allreduce=flashinfer_fusion" not in got


def test_backends_say_whether_their_numbers_are_emulated():
    assert get_backend("emulated").emulated and get_backend("instant").emulated
    assert not get_backend("sglang").emulated and not get_backend("vllm").emulated


def test_a_quoted_line_is_called_verbatim_only_when_it_is():
    """A line holding a ``<HOST>``-style placeholder or changed by redaction is labelled redacted;
    a stored (normalized) signature says so."""
    from sweeps.publish.findings.evidence import decisive_evidence, quoted

    assert quoted("RuntimeError: No supported CUDA architectures")[1] == "verbatim"
    assert quoted("<HOST>:4411:4411 [0] enqueue.cc:1390 NCCL WARN Error")[1] == "redacted"
    r = records.TrialRecord(number=1, state="COMPLETE", params={}, status="failed", failure_class="x",
                      failure_signature="KeyError: <N>")
    assert decisive_evidence(r) == ("KeyError: <N>", "normalized signature")


def test_a_tie_at_the_race_cap_asks_for_a_higher_cap_not_more_repeats(tmp_path):
    """When the race already ran the tie to sweep.confirm.max_repeats, raising repeats adds
    nothing: the next step raises the cap (repeats accumulate)."""
    conf = {**CONF, "max_repeats": 8, "decision": {"status": "budget_spent"},
            "entries": [{**e, "n": 3 if e["is_baseline"] else 8} for e in CONF["entries"]]}
    sec = render_section(ctx(tmp_path, conf=conf), sweep())[0].split("### Next steps")[1]
    assert "overlaps t1 88.6 (83.3–93.9, 8 runs). The race ran them to its cap (`max_repeats`, 8 per config)." in sec
    assert "sweep.confirm.max_repeats=16" in sec and "sweep.confirm.repeats=" not in sec


def test_a_tie_the_race_could_not_decide_asks_for_a_higher_cap(tmp_path):
    """A race stopped as undecidable (its cap could not decide the tie, projected) before the
    cap: the next step raises the cap, says the race stopped early and why, and gives each
    config its own number of runs (the race repeats only the undecided, so they differ)."""
    conf = {**CONF, "max_repeats": 8, "decision": {"status": "undecidable"},
            "entries": [{**e, "n": 5 if e["trial"] == 2 else 3} for e in CONF["entries"]]}
    sec = render_section(ctx(tmp_path, conf=conf), sweep())[0].split("### Next steps")[1]
    assert "the winner t2 89.9 (86.0–93.9, 5 runs) overlaps t1 88.6 (83.3–93.9, 3 runs)." in sec
    assert ("The race stopped them early, at 3-5 runs (`max_repeats` 8 per config): projected to the cap from "
            "their means and spreads so far, they could still not be decided.") in sec
    assert "at 5 repeats" not in sec and "8 could not decide" not in sec
    assert "sweep.confirm.max_repeats=16" in sec and "sweep.confirm.repeats=" not in sec


def test_an_undecidable_tie_asks_for_the_cap_the_projection_names_or_for_none(tmp_path):
    """The race projects the cap that would decide an undecidable tie (decision ``needed``): the
    next step asks for that cap, not a doubling; when no cap up to 8x would, it asks for no more
    repeats (the tie-break's pick stands) and offers a wider margin instead."""
    base = {**CONF, "max_repeats": 8, "margin": 0.01,
            "entries": [{**e, "n": 5 if e["trial"] == 2 else 3} for e in CONF["entries"]]}
    sec = render_section(ctx(tmp_path, conf={**base, "decision": {"status": "undecidable", "needed": 32}}),
                         sweep())[0].split("### Next steps")[1]
    assert "at 32 per config they would be." in sec and "sweep.confirm.max_repeats=32`" in sec
    sec = render_section(ctx(tmp_path, conf={**base, "decision": {"status": "undecidable", "needed": None}}),
                         sweep())[0].split("### Next steps")[1]
    assert "A tie more repeats would not split" in sec and "nor at any cap up to 8 times it" in sec
    assert "sweep.confirm.max_repeats" not in sec and "sweep.confirm.margin=0.02`" in sec


def test_a_tie_of_a_confirmation_without_a_race_asks_for_more_repeats_not_a_higher_cap(tmp_path):
    """race: false stops each config at its repeats (stored as the cap): raising max_repeats alone
    changes nothing, so the next step raises repeats (and the cap with it, which must not be below)."""
    conf = {**CONF, "repeats": 3, "max_repeats": 3, "decision": {"status": "budget_spent"}}
    sec = render_section(ctx(tmp_path, conf=conf), sweep())[0].split("### Next steps")[1]
    assert "The confirmation ran each config its `repeats` (3), with no race." in sec
    assert "sweep.confirm.repeats=6 sweep.confirm.max_repeats=6`" in sec and "ran them to its cap" not in sec
    assert "with the overrides its last run was given" in sec
    # the commands repeat the study's last overrides (its store, its confirm settings), never the
    # ones they set themselves, the sweep's or a new study's; a value with a space is quoted
    c = ctx(tmp_path, conf=conf)
    c.overrides = ["tracking.store_dir=/tmp/st", "sweep.confirm.max_repeats=16", "new_study=true", "sweep=smoke",
                   "+backend.env.NOTE=two words"]
    sec = render_section(c, sweep())[0].split("### Next steps")[1]
    cmd = sec.split("Re-run the confirmation with more")[1].split("`")[1]
    assert cmd == (".venv/bin/python run_sweep.py sweep=eagle3_allreduce study_name=camp tracking.store_dir=/tmp/st "
                   "'+backend.env.NOTE=two words' sweep.confirm.repeats=6 sweep.confirm.max_repeats=6"), cmd


def test_a_contender_the_race_settled_is_no_tie_that_needs_repeats(tmp_path):
    """A race that ended with its budget spent on some contenders and settled others (ranked
    after the pick, which is non-inferior to them): only the open ones need more repeats."""
    conf = {**CONF, "max_repeats": 8, "decision": {"status": "budget_spent", "settled": [1]},
            "entries": [{**e, "n": 3 if e["is_baseline"] else 8} for e in CONF["entries"]]}
    sec = render_section(ctx(tmp_path, conf=conf), sweep())[0].split("### Next steps")[1]
    assert "Ties that need more repeats" not in sec
    opened = {**conf, "decision": {"status": "budget_spent", "settled": []}}
    assert "overlaps t1 88.6" in render_section(ctx(tmp_path, conf=opened), sweep())[0]


@pytest.mark.parametrize("status", ["pick_decided", "equivalent", "separated"])
def test_a_pick_the_race_decided_asks_for_no_more_repeats(tmp_path, status):
    """Overlapping intervals whose pick the race decided (ranked after the pick with no room to
    beat it, shown equivalent, or separated by Welch's test where the intervals still overlap):
    more repeats cannot change the pick, so the next steps never ask for them."""
    conf = {**CONF, "max_repeats": 8, "decision": {"status": status}}
    sec = render_section(ctx(tmp_path, conf=conf), sweep())[0].split("### Next steps")[1]
    assert "Ties that need more repeats" not in sec and "sweep.confirm." not in sec
    undecided = {**conf, "decision": {"status": "undecidable"}}
    assert "Ties that need more repeats" in render_section(ctx(tmp_path, conf=undecided), sweep())[0]


def test_a_tie_only_some_of_which_reached_the_cap_is_not_said_to_have_reached_it(tmp_path):
    conf = {**CONF, "max_repeats": 8, "decision": {"status": "undecidable"},
            "entries": [{**e, "n": 8 if e["trial"] == 1 else 5} for e in CONF["entries"]]}
    sec = render_section(ctx(tmp_path, conf=conf), sweep())[0].split("### Next steps")[1]
    assert "ran them to its cap" not in sec
    assert "The race stopped them early, at 5-8 runs (1 of them at its cap, `max_repeats` 8 per config)" in sec


def test_a_winner_the_race_added_is_not_called_a_sweep_measurement():
    added = rec(90000, 89.5, cuda_graph_max_bs=128, nccl_proto="LL")
    conf = {**CONF, "winner": 90000,
            "entries": [entry(0, 82.0, 78.0, 86.0, base=True),
                        {**entry(2, 89.0, 88.0, 90.0), "n": 5},
                        {**entry(90000, 89.4, 88.6, 90.2, verdict="winner"), "derived_from": 2,
                         "step": "cuda_graph_max_bs 32 -> 128"}],
            "derived": [{"trial": 90000, "config": dict(added.params), "from": 2,
                         "step": "cuda_graph_max_bs 32 -> 128", "in_study": False}]}
    text = "\n".join(best_section(added, 82.0, conf, conf["entries"][-1]))
    assert "No sweep trial measured t90000: the confirmation's race added it, one step simpler than t2 " \
           "(cuda_graph_max_bs 32 -> 128)." in text
    assert "single measurement of t90000" not in text
    # a config no sweep trial measured has its objective only: the line says so, not "TTFT p50 – ms"
    added.metrics = {"decode_tok_s": 89.4}
    text = "\n".join(best_section(added, 82.0, conf, conf["entries"][-1]))
    assert "(TTFT and ITL not recorded for this config: its runs are the confirmation's" in text
    assert "TTFT p50 –" not in text
    # a config measured in the sweep keeps its sentence
    text = "\n".join(best_section(rec(2, 90.1), 82.0, CONF, CONF["entries"][-1]))
    assert "The sweep's single measurement of t2 was 90.1 tok/s." in text
    # runs: the planned repeats, and what the race added on top (not "5/3")
    table = "\n".join(confirmation_lines(conf))
    assert "| t2 | t2 | 5 (3 + 2 the race added) |" in table and "| t0 (baseline) | t0 | 3 |" in table
    # the heading counts every row: the top configs, the baseline, the leader's measured
    # simplifications the race started with, and the configs it added
    head = confirmation_lines({**conf, "top_k": 1, "entries": [*conf["entries"], entry(1, 88.6, 83.3, 93.9)]})[0]
    assert head.startswith("Top 1 configs and the baseline, 1 measured config(s) simpler than the leader, and 1 "
                           "config(s) the race added (see below), re-measured 3× each"), head
    # no row compared output tokens (no launch returned token ids): the heading does not say it did
    assert head.endswith("output token ids not compared: no launch returned any."), head
    both = {**conf, "entries": [*conf["entries"], {**entry(3, 88.0, 87.0, 89.0), "tokens_match": True}]}
    assert confirmation_lines(both)[0].endswith("greedy output token ids compared with the baseline's for the same prompts.")


def test_a_level_skipped_only_for_another_knobs_dead_end_is_still_an_untried_level(tmp_path):
    from sweeps.rules.match import Rule
    from sweeps.rules.store import fingerprint_hash

    spec = load_spec(compose_cfg(["sweep=smoke"]))
    recs = [rec(0, 82.0, baseline=True, cuda_graph_max_bs=128), rec(1, 88.0, cuda_graph_max_bs=64),
            # graph size 512 was proposed once, with FlashInfer fusion: the rule on the fusion answered it
            rec(2, None, status="skipped", allreduce="flashinfer_fusion", cuda_graph_max_bs=512)]
    recs[2].skipped_by_rule = "2"
    for r in recs:
        r.params.pop("nccl_proto")
    rule = Rule(id=2, fingerprint_hash=fingerprint_hash(FP), fingerprint=FP, model=None,
                knobs={"allreduce": "flashinfer_fusion"}, failure_class="flashinfer_allreduce_fusion_unsupported_arch",
                kind="deterministic", signature="x", evidence=[{"sweep": "earlier", "trial_number": 3}])
    text, _ = render_section(ctx(tmp_path, space=spec.space, rules=[rule]), recs)
    line = next(x for x in text.splitlines() if x.startswith("- **Untried levels**"))
    assert "`cuda_graph_max_bs` = 512" in line and "flashinfer_fusion" not in line
    # the "Still untried" section gives the same level, with why it was not launched
    still = text.split("### Still untried")[1].split("\n### ")[0]
    assert "`cuda_graph_max_bs`" in still and "512 (its proposals were skipped by dead ends on other knobs" in still


def test_a_levels_confirmed_mean_outranks_a_single_lucky_draw_of_it(tmp_path):
    # graph size 256: one config of it re-measured at 85.0 (3 fresh runs), another drawn once at 87.5
    recs = sweep() + [rec(5, 87.5, cuda_graph_max_bs=256, nccl_proto="LL"), rec(6, 86.0, cuda_graph_max_bs=256)]
    conf = {**CONF, "entries": [*CONF["entries"], entry(6, 85.0, 83.0, 87.0)]}
    text, _ = render_section(ctx(tmp_path, conf=conf), recs)
    lost = text.split("### What ran and lost")[1].split("\n### ")[0]
    line = next(x for x in lost.splitlines() if x.startswith("- `cuda_graph_max_bs=256`"))
    assert "best 85.0 tok/s (t6, confirmed mean of 3 fresh runs" in line
    assert "cuda_graph_max_bs=256` (87.5" not in lost  # the single draw is no tie with the best


def test_an_approachs_speedup_is_of_its_confirmed_mean_not_its_single_draw(tmp_path):
    text, _ = render_section(ctx(tmp_path), sweep())
    table = text.split("### Approaches", 1)[1].split("\n### ", 1)[0]
    # t1 drew 91.6 once (1.12x the confirmed baseline 82.0) and was re-measured at 88.6 (1.08x); the winner
    # t2, of the same approach, was confirmed at 89.9 (1.10x): the approach's row is the winner's
    assert "| 89.9 (t2, the winner, confirmed); best single draw 91.6 (t1), confirmed 88.6 | 1.10x |" in table, table


def test_an_approach_without_the_winner_keeps_its_own_best(tmp_path):  # a guard of the row above
    text, _ = render_section(ctx(tmp_path), sweep())
    table = text.split("### Approaches", 1)[1].split("\n### ", 1)[0]
    assert "| torch_symm_mem | none | – | – |" in table and table.count("the winner") == 1, table


def test_a_conditional_knobs_tie_names_the_config_it_ties_with_not_the_best(tmp_path):
    # two EAGLE-3 trials within noise of each other, both far below the plain winner: eagle_topk=2 ties
    # with the best EAGLE-3 config, which is not "the best or better"
    e1 = rec(6, 55.2, accept=2.0, speculative="eagle3", cuda_graph_max_bs=128, eagle_num_steps=3, eagle_topk=1,
             eagle_num_draft_tokens=4)
    e2 = rec(7, 54.9, accept=2.0, speculative="eagle3", cuda_graph_max_bs=128, eagle_num_steps=3, eagle_topk=2,
             eagle_num_draft_tokens=4)
    from sweeps.config.spec import load_spec
    from tests.conftest import compose_cfg

    space = load_spec(compose_cfg([])).space  # the campaign's: the eagle_* knobs apply with speculative=eagle3
    text, _ = render_section(ctx(tmp_path, space=space), [*sweep(), e1, e2])
    sec = text.split("### What ran and lost")[1].split("\n### ")[0]
    best_or_better = next((ln for ln in sec.splitlines() if ln.startswith("- Not losses: ")), "")
    assert "eagle_topk" not in best_or_better
    where = next(ln for ln in sec.splitlines() if ln.startswith("- Not losses where their knob applies"))
    assert "of the best such config (t6, 55.2 tok/s) or better: `eagle_topk=2` (54.9 tok/s, t7)" in where


def test_a_level_skipped_for_a_degraded_allreduce_says_so_in_words(tmp_path):
    spec = load_spec(compose_cfg(["sweep=smoke"]))
    recs = [rec(0, 82.0, baseline=True, cuda_graph_max_bs=128), rec(1, 88.0, cuda_graph_max_bs=64),
            rec(2, None, status="skipped", allreduce="custom", cuda_graph_max_bs=512)]
    recs[2].skipped_by_rule = "degraded:allreduce=custom@t1"  # as the degraded gate stores it
    for r in recs:
        r.params.pop("nccl_proto")
    text, _ = render_section(ctx(tmp_path, space=spec.space), recs)
    still = text.split("### Still untried")[1].split("\n### ")[0]
    assert "allreduce=custom fell back to NCCL in t1 (silently degraded)" in still and "@t1" not in still, still


def test_a_group_whose_proposals_hit_another_knobs_dead_end_says_so():
    from sweeps.publish.findings.groups import Group, outcome

    g = Group(("flashinfer_fusion", "eagle3"))
    g.add(records.TrialRecord(5, "PRUNED", {"allreduce": "flashinfer_fusion", "speculative": "eagle3",
                                            "moe_a2a_backend": "flashinfer"}, "skipped",
                              failure_class="moe_ep_a2a_config_error"))
    assert outcome(g, 82.0) == "not launched: its proposals hit known dead ends: moe_ep_a2a_config_error (1)"


def test_an_approachs_outcome_compares_the_value_its_row_quotes(tmp_path):
    """A row whose single draw (81.0) was below the confirmed baseline (82.0) but whose confirmed
    mean (83.0) is above it shows 1.01x and says 'works', not 'slower than baseline (0.99x)'."""
    conf = {**CONF, "entries": [*CONF["entries"], entry(5, 83.0, 80.0, 86.0)]}
    text, _ = render_section(ctx(tmp_path, conf=conf), [*sweep(), rec(5, 81.0, allreduce="custom")])
    table = text.split("### Approaches", 1)[1].split("\n### ", 1)[0]
    row = next(ln for ln in table.splitlines() if ln.startswith("| custom |"))
    assert "81.0 (t5), confirmed 83.0 | 1.01x |" in row and row.endswith("| works |"), row
    # without the re-measurement, the single draw is what the row quotes and compares
    text, _ = render_section(ctx(tmp_path), [*sweep(), rec(5, 81.0, allreduce="custom")])
    row = next(ln for ln in text.split("### Approaches", 1)[1].splitlines() if ln.startswith("| custom |"))
    assert "| 0.99x |" in row and "slower than baseline (0.99x)" in row, row


def test_an_approachs_failures_name_a_re_question_probe_as_one(tmp_path):
    """The console counts failed trials of the budget; the table's failures name a re-question
    probe apart, so 'some configs fail' is not read as a trial the console missed."""
    probe = rec(9, None, status="failed", allreduce="torch_symm_mem", cls="torch_symm_mem_unsupported", sig="KeyError: <N>")
    probe.probe = {records.A_REQUESTION: {"entries": ["torch_symm_mem_table_sm12x"]}}
    text, _ = render_section(ctx(tmp_path), [*sweep(), probe])
    row = next(ln for ln in text.split("### Approaches", 1)[1].splitlines() if ln.startswith("| torch_symm_mem |"))
    assert "fails: torch_symm_mem_unsupported (t4; re-question probe t9)" in row, row
