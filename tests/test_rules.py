"""Tests for sweeps.rules.store: learning, matching, evidence, scoping, fingerprints, concurrency, CLI."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.rules.store import (
    DEFAULT_KNOBS_PATH,
    FINGERPRINT_KEYS,
    RuleStore,
    fingerprint_hash,
    implicated_params,
    load_implicated_knobs,
)
from sweeps.store import sqlite as sqlite_tuning
from sweeps.store.sqlite import use_wal
from tasks.failures import KIND

REPO = Path(__file__).resolve().parents[1]

FP = {"gpu_arch": "sm_120", "gpu_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "driver": "580.95.05",
      "cuda": "12.9", "nccl": "2.27.7", "torch": "2.9.1", "sglang": "0.5.23", "flashinfer": "0.5.3"}
BASE = {"speculative": "none", "allreduce": "nccl", "nccl_algo": "default", "nccl_proto": "default",
        "cuda_graph_max_bs": 512, "moe_a2a_backend": "none", "mem_fraction_static": 0.85}
MODEL = "kimi_k25"


def P(**kw):
    return {**BASE, **kw}


def ev(n, sweep="s1"):
    return {"sweep": sweep, "trial_number": n}


@pytest.fixture
def store(tmp_path):
    s = RuleStore(f"sqlite:///{tmp_path / 'rules.db'}")
    yield s
    s.close()


@pytest.fixture(scope="module")
def mapping():
    return load_implicated_knobs(DEFAULT_KNOBS_PATH)


# ------------------------------------------------------------------ config
def test_knobs_config_covers_every_deterministic_class(mapping):
    det = {c for c, k in KIND.items() if k == "deterministic"}
    assert det <= set(mapping), det - set(mapping)
    assert mapping["flashinfer_allreduce_fusion_unsupported_arch"] == ["allreduce"]
    assert "model" in mapping["cuda_oom_graph_capture"] and "model" not in mapping["torch_symm_mem_unsupported"]


def test_load_rejects_unknown_class(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("not_a_class: [allreduce]\n")
    with pytest.raises(ValueError, match="not_a_class"):
        load_implicated_knobs(p)
    p.write_text("cli_arg_error: allreduce\n")
    with pytest.raises(ValueError, match="list"):
        load_implicated_knobs(p)


@pytest.mark.parametrize("cls, params, signature, expected", [
    ("flashinfer_allreduce_fusion_unsupported_arch", P(allreduce="flashinfer_fusion"), "",
     {"allreduce": "flashinfer_fusion"}),
    # Tree with the default protocol: only the algorithm is implicated (Tree fails whatever proto)
    ("nccl_env_algo_proto_invalid", P(nccl_algo="Tree"), "", {"nccl_algo": "Tree"}),
    # both pinned, NCCL names the algorithm: narrowed to it
    ("nccl_env_algo_proto_invalid", P(nccl_algo="Tree", nccl_proto="LL"),
     "NCCL WARN Error : no algorithm/protocol available for function AllGather. NCCL_ALGO was set to Tree.",
     {"nccl_algo": "Tree"}),
    # both pinned, no attribution in the signature: both values
    ("nccl_env_algo_proto_invalid", P(nccl_algo="Ring", nccl_proto="LL128"), "NCCL error: invalid usage",
     {"nccl_algo": "Ring", "nccl_proto": "LL128"}),
    ("nccl_env_algo_proto_invalid", P(nccl_proto="LL128"), "NCCL_PROTO was set to LL128.", {"nccl_proto": "LL128"}),
    ("moe_ep_a2a_config_error", P(moe_a2a_backend="flashinfer"), "", {"moe_a2a_backend": "flashinfer"}),
    # the implicated knob is at its default: never a rule for "moe_a2a_backend=none", full config instead
    ("moe_ep_a2a_config_error", P(), "", dict(sorted(BASE.items()))),
    ("cuda_oom_graph_capture", P(cuda_graph_max_bs=512, mem_fraction_static=0.9), "",
     {"cuda_graph_max_bs": 512, "mem_fraction_static": 0.9, "speculative": "none"}),
    ("cuda_oom_graph_capture", P(speculative="eagle3", eagle_num_steps=3, eagle_topk=1, eagle_num_draft_tokens=4), "",
     {"cuda_graph_max_bs": 512, "mem_fraction_static": 0.85, "speculative": "eagle3", "eagle_topk": 1,
      "eagle_num_draft_tokens": 4}),
    ("cli_arg_error", P(), "", dict(sorted(BASE.items()))),
    ("server_args_incompatible", P(allreduce="custom"), "", dict(sorted(P(allreduce="custom").items()))),
])
def test_implicated_params(mapping, cls, params, signature, expected):
    assert implicated_params(cls, params, mapping, signature) == expected


def test_class_missing_from_mapping_falls_back_to_full_config():
    assert implicated_params("torch_symm_mem_unsupported", P(allreduce="torch_symm_mem"), {}) == \
        dict(sorted(P(allreduce="torch_symm_mem").items()))


def test_fingerprint_hash_uses_only_stack_keys():
    h = fingerprint_hash(FP)
    assert h == fingerprint_hash({**FP, "hostname": "other", "node": "abc"})
    assert h == fingerprint_hash(dict(reversed(list(FP.items()))))
    assert h != fingerprint_hash({**FP, "sglang": "0.5.24"})
    assert len(h) == 64
    with pytest.raises(ValueError):
        fingerprint_hash({"hostname": "x"})
    assert set(FINGERPRINT_KEYS) >= set(FP)


# ------------------------------------------------------------------ learn / match
def test_learn_then_match_skips_only_implicated_values(store):
    r = store.learn(FP, MODEL, P(allreduce="flashinfer_fusion"), "flashinfer_allreduce_fusion_unsupported_arch",
                    "Exception: Capture cuda graph failed: No supported CUDA architectures found", ev(3))
    assert r is not None and r.knobs == {"allreduce": "flashinfer_fusion"} and r.model is None
    assert r.kind == "deterministic" and r.evidence == [ev(3)] and r.hits == 0
    # any other config with the same allreduce level matches, whatever the other knobs / model
    m = store.match(FP, "other_model", P(allreduce="flashinfer_fusion", cuda_graph_max_bs=128, nccl_algo="Ring"))
    assert m is not None and m.id == r.id and m.hits == 1
    assert store.match(FP, MODEL, P(allreduce="nccl")) is None
    assert store.match(FP, MODEL, {"speculative": "none"}) is None  # knob absent: no match
    assert store.match(FP, MODEL, P(allreduce="flashinfer_fusion"), record_hit=False).hits == 1


def test_learn_is_idempotent_and_merges_evidence(store):
    args = (FP, MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid", "NCCL_ALGO was set to Tree.")
    a = store.learn(*args, ev(1))
    b = store.learn(*args, ev(1))            # same trial again: no duplicate evidence
    c = store.learn(*args, ev(7, "s2"))      # another sweep, same rule
    d = store.learn(FP, MODEL, P(nccl_algo="Tree", nccl_proto="Simple"), "nccl_env_algo_proto_invalid",
                    "x NCCL_ALGO was set to Tree.", ev(9))  # narrowed to the same knob values
    assert a.id == b.id == c.id == d.id
    assert store.get(a.id).evidence == [ev(1), ev(7, "s2"), ev(9)]
    assert store.get(a.id).signature == "NCCL_ALGO was set to Tree."
    assert len(store.list()) == 1


def test_non_deterministic_kinds_do_not_become_rules_unless_forced(store):
    assert store.learn(FP, MODEL, P(), "collective_hang_or_timeout", "watchdog", ev(1)) is None
    assert store.learn(FP, MODEL, P(), "nccl_init_system_error", "shm", ev(1)) is None          # infra
    assert store.learn(FP, MODEL, P(), "nccl_init_system_error", "shm", ev(1), force=True) is None
    assert store.learn(FP, MODEL, P(), "spec_decode_no_speedup", "slow", ev(1), force=True) is None  # perf
    assert store.list() == []
    r = store.learn(FP, MODEL, P(), "cuda_illegal_memory_access", "illegal", ev(2), force=True)
    assert r is not None and r.kind == "transient" and r.scope_sweep == "s1"
    # a forced transient rule is deterministic only for its own sweep
    assert store.match(FP, MODEL, P(), sweep="s1").id == r.id
    assert store.match(FP, MODEL, P(), sweep="s2") is None
    assert store.match(FP, MODEL, P()) is None
    with pytest.raises(ValueError):
        store.learn(FP, MODEL, P(), "no_such_class", "", ev(1))


def test_fingerprint_change_makes_rules_not_apply(store):
    r = store.learn(FP, MODEL, P(allreduce="torch_symm_mem"), "torch_symm_mem_unsupported", "KeyError: <N>", ev(4))
    upgraded = {**FP, "sglang": "0.6.0"}
    assert store.match(upgraded, MODEL, P(allreduce="torch_symm_mem")) is None
    assert store.rules_for_fingerprint(upgraded) == []
    assert [x.id for x in store.rules_for_fingerprint(FP)] == [r.id]
    assert store.match({"hostname": "x"}, MODEL, P(allreduce="torch_symm_mem")) is None  # no stack keys
    # the recheck sweep sees the old dead end, not rules of the current environment
    assert [x.id for x in store.all_dead_ends(exclude_fingerprint=upgraded)] == [r.id]
    assert store.all_dead_ends(exclude_fingerprint=FP) == []
    assert [x.id for x in store.all_dead_ends("s1")] == [r.id]
    assert store.all_dead_ends("other") == []


def test_memory_classes_are_keyed_by_model(store):
    params = P(cuda_graph_max_bs=512, mem_fraction_static=0.92)
    r = store.learn(FP, MODEL, params, "cuda_oom_graph_capture", "Capture cuda graph failed: CUDA out of memory", ev(5))
    assert r.model == MODEL
    assert r.knobs == {"cuda_graph_max_bs": 512, "mem_fraction_static": 0.92, "speculative": "none"}
    assert store.match(FP, MODEL, {**params, "allreduce": "custom"}).id == r.id
    assert store.match(FP, "small_model", params) is None
    assert store.match(FP, MODEL, {**params, "cuda_graph_max_bs": 128}) is None
    assert store.match(FP, MODEL, {**params, "mem_fraction_static": 0.920000000000001}) is not None  # float noise
    other = store.learn(FP, "small_model", params, "cuda_oom_graph_capture", "oom", ev(6))
    assert other.id != r.id and len(store.list(failure_class="cuda_oom_graph_capture")) == 2
    assert [x.id for x in store.list(model="small_model")] == [other.id]


def test_forget_and_get(store):
    r = store.learn(FP, MODEL, P(moe_a2a_backend="flashinfer"), "moe_ep_a2a_config_error", "assert", ev(1))
    assert store.get(r.id) == r
    assert store.forget(r.id) is True
    assert store.get(r.id) is None and store.forget(r.id) is False
    assert store.match(FP, MODEL, P(moe_a2a_backend="flashinfer")) is None


def test_rules_are_shared_across_store_instances(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = RuleStore(url), RuleStore(url)
    r = a.learn(FP, MODEL, P(allreduce="flashinfer_fusion"), "flashinfer_allreduce_fusion_unsupported_arch", "x", ev(1))
    assert b.match(FP, MODEL, P(allreduce="flashinfer_fusion")).id == r.id
    a.close()
    b.close()


def test_in_memory_store():
    s = RuleStore("sqlite://")
    assert s.learn(FP, MODEL, P(allreduce="custom"), "custom_allreduce_graph_error", "x", ev(1)) is not None
    assert s.match(FP, MODEL, P(allreduce="custom")) is not None


_WORKER = """
import sys
from sweeps.rules.store import RuleStore
url, sweep, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fp = {"gpu_arch": "sm_120", "sglang": "0.5.23"}
s = RuleStore(url)
for i in range(n):
    s.learn(fp, "m", {"allreduce": "flashinfer_fusion"}, "flashinfer_allreduce_fusion_unsupported_arch", "sig",
            {"sweep": sweep, "trial_number": i})
"""


def test_two_processes_learning_concurrently_lose_no_evidence(tmp_path):
    url = f"sqlite:///{tmp_path / 'conc.db'}"
    n = 25
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, url, f"s{k}", str(n)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    s = RuleStore(url)
    rules = s.list()
    assert len(rules) == 1
    assert sorted((e["sweep"], e["trial_number"]) for e in rules[0].evidence) == \
        sorted((f"s{k}", i) for k in range(2) for i in range(n))
    s.close()


_HOLD_WRITE_LOCK = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
con.execute("INSERT INTO other VALUES (1)")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("COMMIT")
"""


@contextlib.contextmanager
def _write_locked(db: Path, hold_s: float):
    """The SQLite file ``db`` (a new one in rollback-journal mode) whose write lock another
    process holds for ``hold_s`` s from when the block starts; the block ends once it let go."""
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE IF NOT EXISTS other (x)")
    con.commit()
    con.close()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_WRITE_LOCK, str(db), str(hold_s)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.wait(timeout=30)


def test_a_store_opened_while_another_process_writes_waits_for_its_lock(tmp_path):
    # SQLite refuses the switch to WAL at once (no busy wait) while another connection holds
    # the write lock on a rollback-journal file: the race two processes creating one store run
    db = tmp_path / "busy.db"
    with _write_locked(db, 1.0):
        t0 = time.monotonic()
        s = RuleStore(f"sqlite:///{db}")
        assert time.monotonic() - t0 > 0.5  # it waited out the other writer's 1 s instead of failing
        r = s.learn(FP, MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid", "sig", ev(1))
        assert [x.id for x in s.list()] == [r.id]
        with s.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        s.close()


def test_reading_rules_never_waits_for_a_writer(tmp_path):
    db = tmp_path / "read.db"
    s = RuleStore(f"sqlite:///{db}")
    r = s.learn(FP, MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid", "sig", ev(1))
    s.close()
    with _write_locked(db, 3.0):
        t0 = time.monotonic()
        s = RuleStore(f"sqlite:///{db}")  # the table exists: nothing to write
        assert [x.id for x in s.rules_for_fingerprint(FP)] == [r.id] and s.get(r.id) is not None
        assert s.match(FP, MODEL, P(nccl_algo="Tree"), record_hit=False).id == r.id
        assert time.monotonic() - t0 < 1.5  # not the writer's 3 s
        s.close()


def test_probe_cleared_markers_are_read_without_waiting_and_written_after_a_lock(tmp_path):
    from sweeps.search import probes

    db = tmp_path / "cleared.db"
    s = RuleStore(f"sqlite:///{db}")
    s.learn(FP, MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid", "sig", ev(1))
    s.close()
    with _write_locked(db, 3.0):
        s = RuleStore(f"sqlite:///{db}")
        t0 = time.monotonic()
        assert probes.cleared_entries(s, FP) == set()  # no probe_cleared table yet: nothing created
        assert time.monotonic() - t0 < 1.5  # a read: not the writer's 3 s
        probes.mark_cleared(s, FP, ["a", "b"], {"sweep": "s", "trial_number": 1})  # waits the lock out
        assert time.monotonic() - t0 > 1.5
    assert probes.cleared_entries(s, FP) == {"a", "b"}
    s.close()


def test_the_rules_cli_reports_a_store_locked_past_its_budget_in_one_line(tmp_path, monkeypatch):
    from sweeps.rules import store as rules_mod
    from sweeps.store import retry as store_retry

    db = tmp_path / "cli-locked.db"
    monkeypatch.setattr(rules_mod, "BUSY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(sqlite_tuning, "BUSY_TIMEOUT_MS", 200)  # the process-wide listener, if installed
    monkeypatch.setattr(store_retry, "RETRY_S", 0.5)
    with _write_locked(db, 4.0):
        rc = rules_mod.main(["--db", f"sqlite:///{db}", "list"])  # a new file: creating the table needs the lock
    assert rc == 1


def test_the_switch_to_wal_gives_up_after_its_timeout(tmp_path):
    db = tmp_path / "held.db"
    with _write_locked(db, 3.0):
        con = sqlite3.connect(db)
        t0 = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            use_wal(con, timeout_s=0.3)
        assert 0.3 <= time.monotonic() - t0 < 2.5  # retried for its timeout, then gave up
        con.close()
    assert use_wal(sqlite3.connect(db), timeout_s=0.3) == "wal"  # free again: switched


# ------------------------------------------------------------------ CLI
def _cli(*args, url):
    return subprocess.run([sys.executable, "-m", "sweeps.rules", *args, "--db", url], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_list_explain_forget(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    s = RuleStore(url)
    r = s.learn(FP, MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid", "NCCL_ALGO was set to Tree.", ev(12))
    s.close()

    out = _cli("list", url=url)
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    assert rows[0][:3] == ["id", "class", "kind"]
    assert rows[1][:5] == [str(r.id), "nccl_env_algo_proto_invalid", "deterministic", "-", "nccl_algo=Tree"]
    # the evidence columns: how it was learned, its age in studies, last confirmed, status
    head = dict(zip(rows[0], rows[1], strict=True))
    assert head["learned"] == "one failed launch" and head["age_studies"] == "1" and head["status"] == "active"
    assert head["last_confirmed"] == r.last_confirmed != ""

    out = _cli("explain", str(r.id), url=url)
    assert out.returncode == 0
    assert "nccl_algo=Tree" in out.stdout and "s1#12" in out.stdout and r.fingerprint_hash in out.stdout

    out = subprocess.run([sys.executable, "-m", "sweeps.rules", "--db", url, "forget", str(r.id)], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and "forgot rule" in out.stdout
    assert RuleStore(url).get(r.id) is None
    assert _cli("explain", str(r.id), url=url).returncode == 1
    learned, shipped = _cli("list", url=url).stdout.split("\n\n", 1)
    assert len(learned.splitlines()) == 1  # header only
    assert shipped.startswith("# shipped (conf/knowledge)")


def test_cli_list_shows_shipped_knowledge_for_a_node_apart(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    out = _cli("list", "--node", "rtx_pro_6000x8", url=url)
    assert out.returncode == 0, out.stderr
    learned, shipped = out.stdout.split("\n\n", 1)
    assert learned.splitlines() == ["id\tclass\tkind\tmodel\tknobs\tevidence\thits\tfingerprint\tscope\tlearned\t"
                                    "age_studies\tlast_confirmed\tstatus"]
    head, cols, *rows = shipped.splitlines()
    assert head.startswith("# shipped (conf/knowledge) for node rtx_pro_6000x8 [") and "gpu_arch=sm_120" in head
    ids = {r.split("\t")[0] for r in rows}
    assert {"flashinfer_a2a_needs_nvlink", "nccl_algo_tree_no_allgather", "torch_symm_mem_table_sm12x"} <= ids
    assert all(r.split("\t")[3].startswith("https://") for r in rows)  # each with its public source
    # the upgraded stack (FlashInfer 0.7.2) is past the FlashInfer JIT fix: that entry no longer applies
    up = _cli("list", "--node", "rtx_pro_6000x8_upgraded", url=url).stdout.split("\n\n", 1)[1]
    up_ids = {r.split("\t")[0] for r in up.splitlines()[2:]}
    assert "flashinfer_fusion_jit_gate_sm12x" in ids and "flashinfer_fusion_jit_gate_sm12x" not in up_ids


def test_cli_list_for_a_node_lists_only_the_rules_learned_on_its_fingerprint(tmp_path):
    from sweeps.rules.shipped import node_conf

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    s = RuleStore(url)
    old = s.learn(node_conf("rtx_pro_6000x8")[1], MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid",
                  "NCCL_ALGO was set to Tree.", ev(12))
    new = s.learn(node_conf("rtx_pro_6000x8_upgraded")[1], MODEL, P(allreduce="torch_symm_mem"),
                  "torch_symm_mem_unsupported", "KeyError: 12", ev(13))
    s.close()

    def ids(*node):
        out = _cli("list", *node, url=url)
        assert out.returncode == 0, out.stderr
        return [line.split("\t")[0] for line in out.stdout.split("\n\n", 1)[0].splitlines()[1:]]
    assert ids("--node", "rtx_pro_6000x8") == [str(old.id)]
    assert ids("--node", "rtx_pro_6000x8_upgraded") == [str(new.id)]
    assert sorted(ids()) == sorted([str(old.id), str(new.id)])
    out = _cli("list", "--node", "local_cpu", url=url)  # no declared fingerprint: every rule, and it says so
    assert "declares no fingerprint" in out.stderr and out.stdout.count("\tactive") == 2, out


def test_learn_merges_into_a_rule_another_process_inserted_first(store, monkeypatch):
    """The unique-key race: our INSERT fails because another process inserted the same rule
    between our SELECT and INSERT; the retry merges our evidence into that row."""
    from sqlalchemy.exc import IntegrityError

    real = store._upsert
    calls: list[int] = []

    def racing(values, evidence):
        calls.append(1)
        if len(calls) == 1:
            real(values, ev(9, "other"))  # the other process wins the insert
            raise IntegrityError("INSERT INTO servesweep_failure_rules", {}, Exception("UNIQUE constraint failed"))
        return real(values, evidence)

    monkeypatch.setattr(store, "_upsert", racing)
    r = store.learn(FP, MODEL, P(allreduce="torch_symm_mem"), "torch_symm_mem_unsupported", "KeyError: <N>", ev(1))
    assert len(calls) == 2
    assert [(e["sweep"], e["trial_number"]) for e in r.evidence] == [("other", 9), ("s1", 1)]
    assert len(store.list()) == 1


def test_learn_gives_up_after_three_races(store, monkeypatch):
    from sqlalchemy.exc import IntegrityError

    def always(values, evidence):
        raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))

    monkeypatch.setattr(store, "_upsert", always)
    with pytest.raises(IntegrityError):
        store.learn(FP, MODEL, P(allreduce="torch_symm_mem"), "torch_symm_mem_unsupported", "KeyError: <N>", ev(1))


def test_rule_evidence_strengthen_retire_revive(tmp_path):
    s = RuleStore(f"sqlite:///{tmp_path / 'ev.db'}")
    r = s.learn(FP, MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid", "NCCL_ALGO was set to Tree.",
                {**ev(1), "probe": True, "shipped": ["nccl_algo_tree_no_allgather"]})
    assert r.origin == "shipped" and r.learned_how == "shipped" and r.studies == ["s1"] and r.last_confirmed
    s.record_hit(r.id, "s2")  # a study skipped by it: one study older
    again = s.learn(FP, MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid", "x", ev(5, "s3"))
    assert again.id == r.id and again.origin == "shipped" and again.learned_how == "repeated (2)"
    assert again.studies == ["s1", "s2", "s3"] and again.last_confirmed >= r.last_confirmed
    gone = s.retire(r.id, {"sweep": "s4", "trial_number": 2, "gpu_s": 30.0})
    assert gone.retired_at and gone.retired_evidence["gpu_s"] == 30.0
    assert s.match(FP, MODEL, P(nccl_algo="Tree"), record_hit=False) is None
    assert s.rules_for_fingerprint(FP) == [] and [x.id for x in s.rules_for_fingerprint(FP, retired=True)] == [r.id]
    back = s.learn(FP, MODEL, P(nccl_algo="Tree"), "nccl_env_algo_proto_invalid", "x", ev(9, "s5"))
    assert back.retired_at is None and s.match(FP, MODEL, P(nccl_algo="Tree"), record_hit=False) is not None
    with pytest.raises(ValueError, match="origin"):
        s.learn(FP, MODEL, P(nccl_algo="Ring"), "nccl_env_algo_proto_invalid", "x", ev(1), origin="guess")
    s.close()


def test_cli_names_the_unknown_node_and_the_unknown_id_without_a_traceback(tmp_path, capsys):
    import sweeps.rules.store as rules_cli

    db = f"sqlite:///{tmp_path / 'rules.db'}"
    assert rules_cli.main(["--db", db, "list", "--node", "bogus_node"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--node bogus_node: no such node profile" in err
    assert "rtx_pro_6000x8" in err  # the profiles that exist are listed
    assert rules_cli.main(["--db", db, "explain", "999"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("servesweep.rules: no rule 999") and "sweeps.rules list" in err


def test_cli_list_into_a_closed_pipe_ends_quietly(tmp_path):
    """``python -m sweeps.rules list | head -1``: the reader closes the pipe after one line; the
    CLI exits 0 without a BrokenPipeError traceback."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    p = subprocess.Popen([sys.executable, "-m", "sweeps.rules", "list", "--db", url], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert p.stdout is not None and p.stdout.read(1)  # one byte, then the reader goes away
    p.stdout.close()
    err = p.stderr.read().decode() if p.stderr else ""
    assert p.wait(60) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
