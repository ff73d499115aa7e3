"""Tests of `python report.py`: the diagnosis of DAPO's four boundaries, and the report itself.

Three kinds:
  - `diagnose` (evaluation/diagnosis.py) on synthetic metric histories, one per failure (entropy collapse, contrast
    loss, length-credit pathology, truncation-dominated reward, verifier exceptions) and a
    healthy one: exactly the expected boundary fires, and nothing on the healthy history;
  - end-to-end: two real 3-step runs of train.py on the tiny default (DAPO, and the same run with
    every DAPO switch off), then `report.py` on one run and on both overlaid; every PNG is
    opened and must be a real image, and report.md must hold its tables;
  - damaged run files: one error line naming the file (and line) and the rule, a row per rule.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_report.py
"""

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import report as rp  # noqa: E402
import train  # noqa: E402
from evaluation import diagnosis  # noqa: E402
from plumbing import cli  # noqa: E402

DAPO_CFG = dataclasses.asdict(train.Config())  # the DAPO recipe (every switch on)
GRPO_CFG = {**DAPO_CFG, **train.PRESETS["grpo"]}  # every switch off
SMALL = ["--steps", "3", "--eval_limit", "8", "--eval_k", "2", "--prompts_per_step", "8", "--gen_prompts_per_round", "12",
         "--mini_batch_size", "32"]


# --- diagnose() on synthetic histories ------------------------------------------------------------


def history(n: int = 20, **override) -> list[dict]:
    """A healthy n-step metrics.jsonl; override={key: value or function of the step index}."""
    rng = np.random.default_rng(0)
    rows = []
    for s in range(n):
        m = {"step": s, "policy/entropy": 0.5 + 0.02 * rng.standard_normal(), "policy/clipfrac_high": 0.01,
             "policy/clipfrac_low": 0.008, "groups/kept_frac": 0.6, "groups/all_correct_frac": 0.2,
             "groups/all_wrong_frac": 0.2, "groups/gen_rounds": 1, "length/mean": 100.0, "length/correct_mean": 95.0,
             "length/wrong_mean": 105.0, "length/truncated_frac": 0.01, "length/truncated_frac_wrong": 0.02,
             "verifier/ok": 50, "verifier/wrong": 78, "verifier/exceptions": 0, "envelope/samples_generated": 128}
        for k, v in override.items():
            m[k] = v(s) if callable(v) else v
        rows.append(m)
    return rows


def boundaries(findings) -> list[str]:
    return [f.boundary for f in findings]


@pytest.mark.parametrize("cfg", [DAPO_CFG, GRPO_CFG, None])
def test_healthy_history_fires_nothing(cfg):
    assert diagnosis.diagnose(history(), cfg) == []


def test_entropy_collapse_is_exploration():
    hist = history(**{"policy/entropy": lambda s: 0.5 * 0.85**s, "policy/clipfrac_high": lambda s: 0.01 * 0.6**s})
    (f,) = diagnosis.diagnose(hist, GRPO_CFG)  # eps_high = eps_low: Clip-Higher off
    assert f.boundary == "exploration" and f.severity == "critical" and "--eps_high" in f.switch
    ent = next(e for e in f.evidence if e.metric == "policy/entropy" and e.steps[0] > 0)
    assert ent.steps == (15, 16, 17, 18, 19) and ent.values[-1] < 0.05
    assert boundaries(diagnosis.diagnose(hist, None)) == ["exploration"]  # no config: still fires
    # Clip-Higher on and the upper clip acting: a warning that points at eps_high / lr, not at the switch being off.
    (w,) = diagnosis.diagnose(history(**{"policy/entropy": lambda s: 0.5 * 0.85**s}), DAPO_CFG)
    assert w.boundary == "exploration" and w.severity == "warning"


def test_entropy_fall_while_ever_more_groups_find_a_right_answer_is_sharpening():
    # The loop base's runs (bench/symptoms.py): entropy kept ~30% of its start while the policy learned to stop looping
    # and the share of groups with a right answer rose. Collapse is the fall that stops that share from rising.
    fall = {"policy/entropy": lambda s: 0.17 * 0.9**s, "policy/clipfrac_high": 0.0}
    learning = rp.diagnose(history(**fall, **{"groups/all_wrong_frac": lambda s: 0.25 - 0.01 * s}), DAPO_CFG)
    assert learning == []
    (f,) = rp.diagnose(history(**fall, **{"groups/all_wrong_frac": lambda s: 0.2 + 0.004 * s}), DAPO_CFG)  # stalled
    assert f.boundary == "exploration" and "share of groups with a right answer went 0.79 -> 0.73" in f.message
    assert {e.metric for e in f.evidence} >= {"policy/entropy", "groups/all_wrong_frac"}
    # Without groups/all_wrong_frac (an older history) the fall alone decides, as before.
    old = [{k: v for k, v in m.items() if k != "groups/all_wrong_frac"} for m in history(**fall)]
    assert boundaries(rp.diagnose(old, DAPO_CFG)) == ["exploration"]
    # Below the absolute floor the samples are near copies, whatever the share.
    floor = history(**{"policy/entropy": 0.004, "groups/all_wrong_frac": lambda s: 0.25 - 0.01 * s})
    assert boundaries(rp.diagnose(floor, DAPO_CFG)) == ["exploration"]


def test_entropy_below_absolute_floor_from_the_start_is_exploration():
    hist = history(**{"policy/entropy": 0.004, "policy/clipfrac_high": 0.0})
    assert boundaries(diagnosis.diagnose(hist, DAPO_CFG)) == ["exploration"]


def test_contrast_loss_with_dynamic_sampling_at_its_budget():
    late = lambda s: s >= 10  # noqa: E731
    hist = history(**{"groups/all_correct_frac": lambda s: 0.2 + 0.05 * s, "groups/all_wrong_frac": 0.2,
                      "groups/kept_frac": lambda s: 0.6 - 0.03 * s, "groups/gen_rounds": lambda s: 4 if late(s) else 1,
                      "groups/exhausted": lambda s: 1.0 if s >= 17 else None})
    (f,) = diagnosis.diagnose(hist, DAPO_CFG)  # max_gen_rounds = 4
    assert f.boundary == "contrast" and f.severity == "critical" and "--dynamic_sampling" in f.switch
    assert {e.metric for e in f.evidence} >= {"groups/all_correct_frac", "groups/kept_frac", "groups/gen_rounds", "groups/exhausted"}


def test_one_generation_round_is_not_a_binding_round_budget():
    # --preset smollm2-arith: max_gen_rounds 1, so every step "uses all its rounds"; only a short batch says something.
    one = {**DAPO_CFG, "max_gen_rounds": 1}
    assert rp.diagnose(history(), one) == []
    (f,) = rp.diagnose(history(**{"groups/exhausted": lambda s: 1.0 if s >= 17 else None}), one)
    assert f.boundary == "contrast" and f.severity == "critical" and "generation rounds" not in f.message


def test_a_mostly_full_batch_after_every_round_is_a_cost_not_a_lost_contrast():
    # The SmolLM2 contrast pair's repaired arm (--max_gen_rounds 3): every round used and the batch short on each of
    # the last steps, but 9 of the 12 wanted groups trained, each with advantage: not the boundary failing ...
    cfg = {**DAPO_CFG, "max_gen_rounds": 3, "prompts_per_step": 12}
    short = {"groups/gen_rounds": 3, "groups/exhausted": 1.0, "groups/kept_frac": 0.25}
    assert rp.diagnose(history(**short, **{"groups/kept": 9}), cfg) == []
    # ... while a batch under half the wanted groups is, with the rounds named; a history without groups/kept (older
    # runs) counts every short step, as before.
    (f,) = rp.diagnose(history(**short, **{"groups/kept": 5}), cfg)
    assert f.boundary == "contrast" and f.severity == "critical" and "batch was short (under 50% of the 12" in f.message
    assert "used all 3 generation rounds" in f.message
    (g,) = rp.diagnose(history(**short), cfg)
    assert g.severity == "critical" and "batch was short" in g.message


def test_contrast_loss_without_dynamic_sampling():
    hist = history(**{"groups/all_correct_frac": 0.6, "groups/all_wrong_frac": 0.3, "groups/kept_frac": 0.67})
    (f,) = diagnosis.diagnose(hist, {**DAPO_CFG, "dynamic_sampling": False})
    assert f.boundary == "contrast" and f.severity == "critical" and "off" in f.message
    assert diagnosis.diagnose(history(**{"groups/all_correct_frac": 0.5, "groups/all_wrong_frac": 0.2}), DAPO_CFG) == []


def test_long_wrong_answers_under_sample_mean_are_credit():
    grow = {"length/mean": lambda s: 100 + 8 * s, "length/wrong_mean": lambda s: 110 + 12 * s, "length/correct_mean": 90.0}
    (f,) = diagnosis.diagnose(history(**grow), {**DAPO_CFG, "loss_agg": "seq-mean-token-mean"})
    assert f.boundary == "credit" and f.severity == "critical" and "token-mean" in f.switch
    # Negative control: the token-level loss already weighs every token alike; nothing fires.
    assert diagnosis.diagnose(history(**grow), DAPO_CFG) == []
    # Too short a history for a trend: nothing fires.
    assert diagnosis.diagnose(history(3, **grow), {**DAPO_CFG, "loss_agg": "seq-mean-token-mean"}) == []


def test_long_wrong_answers_beside_right_ones_are_credit_without_length_growth():
    # bench/symptoms.py's credit pair: loops among the wrong answers, mean lengths close and falling.
    loops = {"length/long_wrong_frac": lambda s: 0.25 - 0.01 * s, "length/mean": lambda s: 36 - 0.2 * s}
    (f,) = rp.diagnose(history(**loops), {**DAPO_CFG, "loss_agg": "seq-mean-token-mean"})
    assert f.boundary == "credit" and f.severity == "critical" and "1.2x as long" in f.message
    assert f.evidence[-1].metric == "length/long_wrong_frac" and len(f.evidence[-1].steps) == 20  # the whole run
    assert rp.diagnose(history(**loops), DAPO_CFG) == []  # token-mean: every token weighs alike
    assert rp.diagnose(history(**{"length/long_wrong_frac": 0.05}), {**DAPO_CFG, "loss_agg": "seq-mean-token-mean"}) == []


def test_long_wrong_fracs_from_rollouts():
    from evaluation import diagnosis

    def r(step, group, correct, tokens):
        return {"step": step, "group_id": group, "correct": correct, "response_tokens": tokens}

    rows = [r(0, "a", True, 30), r(0, "a", False, 36), r(0, "a", False, 35), r(0, "a", False, 31),  # 36 >= 1.2 x 30
            r(0, "b", False, 90), r(0, "b", False, 10),  # no right answer in the group: not counted
            r(1, "c", True, 20), r(1, "c", True, 25), r(1, "c", False, 29)]  # against the longest right one, 25
    assert diagnosis.long_wrong_fracs(rows) == pytest.approx({0: 1 / 3, 1: 0.0})
    hist = diagnosis.with_rollout_metrics([{"step": 0}, {"step": 1, "length/long_wrong_frac": 0.5}, {"step": 2}], rows)
    assert [h.get("length/long_wrong_frac") for h in hist] == [pytest.approx(1 / 3), 0.5, None]  # logged values kept
    assert diagnosis.with_rollout_metrics([{"step": 0}], None) == [{"step": 0}]


def test_truncation_dominated_reward_is_reward():
    cut = {"length/truncated_frac": 0.3, "length/truncated_frac_wrong": 0.8, "length/wrong_mean": 300.0,
           "length/mean": lambda s: 150 + 5 * s}
    # Under GRPO (sample-level mean, no overlong shaping): long wrong answers explained by the budget
    # are the reward boundary, not credit.
    (f,) = diagnosis.diagnose(history(**cut), GRPO_CFG)
    assert f.boundary == "reward" and f.severity == "critical" and "--overlong_penalty" in f.switch
    (w,) = diagnosis.diagnose(history(**cut), DAPO_CFG)
    assert w.boundary == "reward" and w.severity == "warning" and "--max_response_len" in w.message


def test_truncation_under_the_overlong_filter_is_not_scored_as_wrong():
    # The filter masks truncated answers: the reward does not call them wrong, so the boundary holds ...
    cut = {"length/truncated_frac": 0.3, "length/truncated_frac_wrong": 0.8}
    assert rp.diagnose(history(**cut), {**DAPO_CFG, "overlong_filter": True}) == []
    # ... unless it takes most of the batch out of the loss: then the budget is too small to learn from.
    (w,) = rp.diagnose(history(**{**cut, "length/truncated_frac": 0.6}), {**DAPO_CFG, "overlong_filter": True})
    assert w.boundary == "reward" and w.severity == "warning" and "--overlong_filter takes them out" in w.message


def test_uniform_groups_under_dynamic_sampling_are_a_cost_not_a_finding():
    half = {"groups/all_correct_frac": 0.1, "groups/all_wrong_frac": 0.6, "groups/kept_frac": 0.3}
    assert rp.diagnose(history(**half), DAPO_CFG) == []  # filtered out before the update; kept_frac 0.3 is affordable
    (f,) = rp.diagnose(history(**half), {**DAPO_CFG, "dynamic_sampling": False})  # trained on: 70% of the batch is inert
    assert f.boundary == "contrast" and f.severity == "critical" and "no gradient toward right answers" in f.message
    (u,) = rp.diagnose(history(**half), None)  # unknown switches: a warning
    assert u.boundary == "contrast" and u.severity == "warning"


def test_verifier_exceptions_are_reward():
    (f,) = diagnosis.diagnose(history(**{"verifier/exceptions": 5, "verifier/timeout": 5}), DAPO_CFG)
    assert f.boundary == "reward" and "verifier" in f.switch and f.evidence[0].metric == "verifier/exceptions"


# --- diagnose() on the histories of real runs (bench/symptoms.py) -------------------------------------------
#
# Each fixture is one run of a broken/repaired pair of bench/symptoms.py
# (docs/results.md "The four boundaries, seen"), trimmed to what the diagnosis reads (bench/symptoms.py export_fixture). Where the pair showed its symptom
# (the arms' difference excluded 0 over the seeds), the pair's boundary must be named on the broken run of each seed
# and not on its repaired run. Where it did not (symptom_shown false: the two arms behaved alike), the two runs of a
# seed must be read alike: the boundary named on both or on neither.

SYMPTOM_FIXTURES = sorted((Path(__file__).parent / "fixtures" / "symptoms").glob("*.json"))


def _fixture_pairs() -> dict:
    pairs: dict = {}
    for f in SYMPTOM_FIXTURES:
        doc = json.loads(f.read_text())
        pairs.setdefault((doc["boundary"], doc["model"] + (f" {doc['regime']}" if doc.get("regime") else ""), doc["seed"]),
                         {})[doc["arm"]] = doc
    return pairs


def test_every_boundary_has_real_run_fixtures():
    pairs = _fixture_pairs()
    for boundary in ("exploration", "contrast", "credit", "budget"):
        seeds = [k for k, arms in pairs.items() if k[0] == boundary and set(arms) == {"broken", "repaired"}]
        assert len(seeds) >= 3, f"{boundary}: {len(seeds)} seeds with both arms"


@pytest.mark.parametrize("key", sorted(_fixture_pairs()), ids=lambda k: f"{k[0]}-{k[1]}-seed{k[2]}")
def test_real_run_histories_name_their_boundary_only_when_broken(key):
    arms = _fixture_pairs()[key]
    found = {arm: [f for f in rp.diagnose(doc["metrics"], doc["config"]) if f.boundary == doc["diagnosis_boundary"]]
             for arm, doc in arms.items()}
    named = {arm: bool(fs) for arm, fs in found.items()}
    if arms["broken"]["symptom_shown"]:
        assert named["broken"], arms["broken"]["source"]
        assert not named["repaired"], (arms["repaired"]["source"], [f.message for f in found["repaired"]])
    else:
        assert named["broken"] == named["repaired"], (arms["broken"]["source"], named)


def test_diagnose_rejects_an_empty_history():
    with pytest.raises(ValueError, match="at least one logged step"):
        diagnosis.diagnose([], None)


def test_age_buckets_are_powers_of_two():
    assert [rp.age_bucket(a)[1] for a in (0, 1, 2, 3, 4, 7, 8, 100)] == ["0", "1", "2-3", "2-3", "4-7", "4-7", "8-15", "64-127"]
    rows = rp.age_slices([{"learner_version": 5, "policy_version": v, "reward": r, "correct": r > 0, "response_tokens": 10}
                          for v, r in ((5, 1.0), (5, -1.0), (4, 1.0), (1, -1.0))])
    assert [r[:3] for r in rows] == [["0", 2, 0.0], ["1", 1, 1.0], ["4-7", 1, -1.0]]
    with pytest.raises(ValueError, match="before it existed"):
        rp.age_bucket(-1)


# --- the report on real tiny runs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real 3-step runs: the DAPO default, and every DAPO switch off (no held-out set)."""
    base = tmp_path_factory.mktemp("runs")
    train.main(SMALL + ["--run_dir", str(base / "dapo")])
    train.main(["--preset", "grpo", *SMALL, "--eval_data", "", "--run_dir", str(base / "grpo")])
    return base / "dapo", base / "grpo"


def assert_pngs(out, names):
    import matplotlib.image as mpimg

    for name in names:
        img = mpimg.imread(out / name)  # (H, W, 4) floats
        assert img.ndim == 3 and img.shape[0] >= 200 and img.shape[1] >= 300, (name, img.shape)
        assert np.ptp(img[..., :3]) > 0.5, f"{name} is blank"


def test_report_of_one_real_run(runs, capsys):
    res = rp.main([str(runs[0])])
    out = runs[0] / "report"
    assert res["out"] == out and (out / "report.md").is_file() and (out / "diagnosis.json").is_file()
    assert {"reward.png", "length.png", "length_hist.png", "entropy.png", "clipfrac.png", "groups.png", "time.png"} <= set(res["plots"])
    assert_pngs(out, res["plots"])
    md = (out / "report.md").read_text()
    for heading in ("## Run identity", "## Config", "## Results and their resource envelope", "## Response length and correctness",
                    "## Rollout age", "## Diagnosis"):
        assert heading in md
    meta = json.loads((runs[0] / "config.json").read_text())
    assert meta["run_id"] in md and meta["verifier_version"] in md and meta["dataset_hash"] in md
    assert "held-out avg@2, before -> after" in md and "not accuracy" in md
    assert "| envelope: samples generated |" in md and "| envelope: trained tokens |" in md
    assert "| response length (tokens) | rollouts | share | correct frac | truncated frac | verifier reasons |" in md
    assert "| all | " in md
    n_rollouts = sum(1 for _ in open(runs[0] / "rollouts.jsonl"))
    assert f"| {runs[0].name} | 0 | {n_rollouts} |" in md  # age table: every rollout synchronous
    assert "| exploration | ENTROPY_REL_FLOOR |" in md
    # the audit of rewarded answers (evaluation/audit.py; its flags are tested on a planted exploit in tests/test_audit.py)
    rows = [json.loads(line) for line in open(runs[0] / "rollouts.jsonl")]
    audited = json.loads((out / "audit.json").read_text())[runs[0].name]
    assert (audited["rollouts"], audited["rewarded"]) == (len(rows), sum(r["correct"] for r in rows))
    assert f"{audited['rewarded']} rewarded of {len(rows)} rollouts (verifier mode dapo)." in md
    printed = capsys.readouterr().out
    fs = res["findings"][runs[0].name]
    assert f"[{runs[0].name}] " + ("healthy" if not fs else f"{len(fs)} finding(s)") in printed.splitlines()


def test_probe_plot_appears_with_probe_metrics_and_is_skipped_without(runs, tmp_path):
    for name, probes in (("with", True), ("without", False)):
        d = tmp_path / name
        shutil.copytree(runs[0], d, ignore=shutil.ignore_patterns("final", "report"))
        rows = [{k: v for k, v in json.loads(line).items() if not k.startswith("probe/")} for line in open(d / "metrics.jsonl")]
        if probes:  # logged every 2 steps, as a probe every K steps would be
            for r in rows[::2]:
                r["probe/avg@4"] = 0.25 + 0.01 * r["step"]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        res = rp.run_report([d])
        assert ("probe.png" in res["plots"]) == probes
        md = (d / "report" / "report.md").read_text()
        assert ("probe.png skipped" in md) == (not probes)
        if probes:
            assert_pngs(d / "report", ["probe.png"])


def test_report_of_two_runs_overlays_them(runs, tmp_path):
    res = rp.main([str(runs[0]), str(runs[1]), "--out", str(tmp_path / "ab")])
    out = tmp_path / "ab"
    assert_pngs(out, res["plots"])
    md = (out / "report.md").read_text()
    assert "# Run report: dapo vs grpo" in md and "| field | default | dapo | grpo |" in md
    assert "| eps_high | 0.28 | 0.28 | 0.2 |" in md and "| loss_agg | token-mean | token-mean | seq-mean-token-mean |" in md
    assert "### dapo" in md and "### grpo" in md  # length tables and diagnosis per run
    assert "| held-out set | 8 problems x k=2 | none |" in md
    assert set(res["findings"]) == {"dapo", "grpo"}
    assert set(json.loads((out / "diagnosis.json").read_text())) == {"dapo", "grpo"}
    assert set(json.loads((out / "audit.json").read_text())) == {"dapo", "grpo"} and md.count("## Audit of rewarded answers") == 1


def test_report_rejects_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        rp.run_report([tmp_path])


DAMAGED = [  # (file, its text, the start of the one error line after the file's path): one row per input rule of load_run
    ("config.json", "nope", "config.json is not JSON"),
    ("config.json", "[1, 2]", "config.json is not a JSON object"),
    ("config.json", '{"config": 3}', "config.json is not a JSON object (with a 'config' object"),
    ("summary.json", "{", "summary.json is not JSON"),
    ("metrics.jsonl", "[1]\n", "metrics.jsonl:1 is not a JSON object"),
    ("metrics.jsonl", '{"step": 0}\n{"policy/entropy": "abc"}\n', "metrics.jsonl:2: policy/entropy is 'abc', not of type float"),
    ("rollouts.jsonl", '{"step": 0, "response_tokens": "x"}\n', "rollouts.jsonl:1: response_tokens is 'x', not of type int"),
    ("rollouts.jsonl", '{"step": 0, "correct": 1}\n', "rollouts.jsonl:1: correct is 1, not of type bool"),
]


@pytest.mark.parametrize("name,text,message", DAMAGED, ids=[f"{n}: {t.strip()}" for n, t, _ in DAMAGED])
def test_damaged_run_files_are_one_line_naming_the_file(name, text, message, tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    (tmp_path / name).write_text(text)
    code = cli.run_cli(rp.main, [str(tmp_path), "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {tmp_path / name}"), err
    assert message in err[0] and "train.py --run_dir" in err[0]
