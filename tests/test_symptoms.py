"""bench/symptoms.py: DAPO's four boundaries seen breaking and repaired, its pieces at tiny sizes.

Kinds: the pairs' premise (each pair's two arms differ in exactly the switches of its boundary, and
both arms are configs train.py accepts); the symptom detectors on hand-made rollouts (a repeated
line, a truncated answer still on the reference's track, the budget completion share from two
eval reports, the zero-advantage share); the statistics and the table on hand-made run records
(the per-seed difference and its Student-t interval, the paired held-out comparison, symptoms.md,
the plot). The runs themselves are what `python bench/symptoms.py` does (docs/results.md "The four
boundaries, seen"); report.py's checks on their histories are tested in tests/test_report.py.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_symptoms.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import ladder  # noqa: E402
import symptom_metrics as sm  # noqa: E402
import symptoms as sy  # noqa: E402
import train  # noqa: E402

SWITCHES = {"exploration": {"eps_high"}, "contrast": {"dynamic_sampling"}, "credit": {"loss_agg"},
            "budget": {"overlong_filter", "overlong_penalty"}}


@pytest.mark.parametrize("key", sorted(sy.PAIRS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_each_pair_flips_only_its_boundary_switch(key, tmp_path):
    pair = sy.PAIRS[key]
    args = sy.parse(["--boundary", pair.boundary, "--out", str(tmp_path)])
    cfgs = {arm: dataclasses.asdict(train.parse_config(sy.train_argv(pair, arm, 0, tmp_path / arm, tmp_path / "base", args)))
            for arm in sy.ARMS}
    changed = {k for k in cfgs["broken"] if cfgs["broken"][k] != cfgs["repaired"][k]} - {"run_dir"}
    b, r = cfgs["broken"], cfgs["repaired"]
    if pair.boundary == "contrast" and not b["dynamic_sampling"]:  # rounds to refill the batch: unused with the filter off
        changed -= {"max_gen_rounds"}
    assert changed == SWITCHES[pair.boundary], changed
    if pair.boundary == "exploration":  # symmetric clip against Clip-Higher
        assert b["eps_high"] == b["eps_low"] and r["eps_high"] > r["eps_low"]
    elif pair.boundary == "contrast":
        assert not b["dynamic_sampling"] and r["dynamic_sampling"]
    elif pair.boundary == "credit":
        assert b["loss_agg"] == "seq-mean-token-mean" and r["loss_agg"] == "token-mean"
    else:  # truncation scored as wrong against the overlong filter and the soft punishment
        assert not (b["overlong_filter"] or b["overlong_penalty"]) and r["overlong_filter"] and r["overlong_penalty"]
    assert pair.metric in sy.SYMPTOMS and pair.why


def test_an_undefined_pair_is_one_line_naming_the_defined_ones():
    with pytest.raises(ValueError, match=r"no pair is defined for it \(defined: .*contrast on tiny"):
        sy.pair_of("contrast", "no-such-model")


def test_repeated_line_and_on_track():
    assert sm.repeated_line("4+8=12\n4+8=12\nAnswer: 12") and not sm.repeated_line("4+8=12\n1+0+1=2\nAnswer: 212")
    assert not sm.repeated_line("Answer: 5\n\n")  # blank lines are not a loop
    assert sm.reference_solution("<|user|>What is 347+85?\n<|assistant|>") == "7+5=12\n4+8+1=13\n3+0+1=4\nAnswer: 432"
    assert sm.reference_solution("Compute 3 * 4.") is None
    row = {"prompt": "What is 347+85?", "truncated": True}
    assert sm.on_track({**row, "response": "7+5=12\n4+8+1=13\n3+0"})  # cut, but right so far
    assert not sm.on_track({**row, "response": "7+5=12\n4+8+1=14\n3+0"})  # cut and already wrong
    assert not sm.on_track({**row, "truncated": False, "response": "7+5=12"})  # not truncated
    assert sm.on_track({**row, "response": "7+5=12\n7+5=12\n4+8+1=13\n3+0"})  # a loop, right so far otherwise
    assert sm.collapse_repeats("a\na\nb\na") == "a\nb\na"


def _eval_report(correct, truncated):
    return {"per_problem": [{"correct": c, "truncated": t} for c, t in zip(correct, truncated)]}


def test_budget_completion_counts_truncated_samples_right_at_the_larger_budget():
    short = _eval_report([[False, False, True], [False, False, False]], [[True, True, False], [True, False, False]])
    long = _eval_report([[True, False, True], [True, False, False]], [[False, True, False], [False, False, False]])
    got = sm.budget_completion(short, long)
    assert got["truncated_heldout"] == pytest.approx(3 / 6)
    assert got["truncated_right_at_long"] == pytest.approx(2 / 3)  # two of the three truncated ones finish right
    assert got["long_minus_short"] == pytest.approx((3 - 1) / 6)


def _run(rollouts, metrics=None):
    return {"metrics": metrics or [{"step": s, "policy/optimizer_steps": 2} for s in sorted({r["step"] for r in rollouts})],
            "rollouts": rollouts, "evals": {}}


def test_zero_advantage_share_of_the_trained_responses():
    rows = ([{"step": 0, "kept": True, "advantage": a} for a in (0.0, 0.0, 1.2, -1.2)]
            + [{"step": 0, "kept": False, "advantage": None}] * 4  # generated, not trained: not counted
            + [{"step": 1, "kept": True, "advantage": a} for a in (0.0, 0.5, -0.5, 0.0)])
    value, steps, series, extras = sm.sym_zero_adv(_run(rows))
    assert steps == [0, 1] and series == [0.5, 0.5] and value == 0.5
    assert extras["effective_per_optimizer_step"] == pytest.approx(4 / 4)  # 4 non-zero responses, 2 x 2 optimizer steps


def test_repetitive_share_of_the_wrong_answers():
    q = "What is 1+1?"
    rows = [{"step": 0, "prompt": q, "correct": False, "response": "1+1=2\n1+1=2\nAnswer: 9"},  # a loop
            {"step": 0, "prompt": q, "correct": False, "response": "1+1=2\nAnswer: 3"},
            {"step": 0, "prompt": q, "correct": True, "response": "1+1=2\n1+1=2\nAnswer: 2"},  # right: not in the share
            {"step": 0, "prompt": "What is 11+11?", "correct": False, "response": "1+1=2\n1+1=2\nAnswer: 23"}]  # 2 columns
    value, steps, series, extras = sm.sym_long_wrong(_run(rows, [{"step": 0}]))
    assert series == [1 / 3] and value == pytest.approx(1 / 3) and extras["repetitive_share_correct_last"] == 1.0
    assert sm.repetitive({"prompt": "Compute 2*3.", "response": "I think.\nI think.\nAnswer: 6"})  # another task: a line twice


def test_long_wrong_share_reads_each_group_against_its_longest_right_answer():
    """A wrong answer counts when >= 1.2x as long as its group's longest right answer; groups without a right answer
    and steps without a counted group are left out; the value is the mean over the steps that remain."""
    def r(step, group, correct, tokens):
        return {"step": step, "group_id": group, "correct": correct, "response_tokens": tokens, "prompt": "What is 1+1?",
                "response": "1+1=2\nAnswer: 2" if correct else "1+1=2\nAnswer: 3"}
    rows = [r(0, 0, True, 10), r(0, 0, True, 20), r(0, 0, False, 25), r(0, 0, False, 23),  # 25 >= 1.2 x 20, 23 is not
            r(0, 1, True, 10), r(0, 1, False, 30),  # 30 >= 12
            r(0, 2, False, 99), r(0, 2, False, 99),  # no right answer: not read
            r(1, 3, True, 10), r(1, 3, False, 11), r(1, 3, False, 13),  # 13 counts, 11 does not
            r(2, 4, False, 50)]  # step 2: no group with a right answer
    value, steps, series, extras = sm.sym_long_wrong_share(_run(rows, [{"step": s} for s in range(3)]))
    assert steps == [0, 1] and series == pytest.approx([2 / 3, 1 / 2]) and value == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert extras["repetitive_wrong_last"] == 0.0  # the looping share (sym_long_wrong) rides along: no wrong answer loops


def _record(boundary, arm, seed, value, run_dir):
    return {"boundary": boundary, "model": sy.TINY, "arm": arm, "seed": seed, "run_dir": str(run_dir), "value": value,
            "names_boundary": arm == "broken", "switches": {"dynamic_sampling": arm == "repaired"}, "metric": "zero_adv_share",
            "diagnosis": ["contrast"] if arm == "broken" else [], "series": {"steps": [0, 1], "values": [value, value]},
            "envelope": {"wall_s_command": 1.0, "samples_generated": 10, "active_samples": 8, "trained_tokens": 80,
                         "generated_tokens": 100, "peak_memory_gb": 0.5}}


def test_a_pair_whose_requirement_fails_is_not_shown(tmp_path):
    """The budget pair's metric may separate the arms with no right answer lost to the budget: summarize's "shown"
    (what the fixtures record) then says no, and the table says why."""
    pair = dataclasses.replace(sy.PAIRS[("budget", sy.TINY)], eval_k=2)
    assert pair.requires == "truncated_right_at_long"
    records = []
    for seed, (b, r) in enumerate(((0.000, 0.010), (0.001, 0.012), (0.000, 0.009))):
        for arm, v in (("broken", b), ("repaired", r)):
            d = tmp_path / "budget" / f"{arm}-seed{seed}"
            (d / "eval").mkdir(parents=True)
            (d / "eval" / "report.json").write_text(json.dumps(_full_report([[True, False], [False, False]])))
            records.append(_record("budget", arm, seed, v, d) | {"extras": {"truncated_right_at_long": None if seed else 0.0}})
    base = _full_report([[False, False]] * 2)
    s = sy.summarize(pair, records, base)
    assert s["excludes_zero"] and s["in_expected_direction"] and not s["shown"]
    assert "yes, not shown: no broken run has truncated_right_at_long > 0" in sy.render([s | {"steps": 30}], records)
    records[0]["extras"]["truncated_right_at_long"] = 0.25  # seed 0's broken policy lost a right answer to the budget
    assert sy.summarize(pair, records, base)["shown"]


def _full_report(correct):
    """An eval.py report.json with what compare reads: ids, k verdicts, the vote."""
    k = len(correct[0])
    return {"settings": {"k": k}, "per_problem": [{"id": f"p{i}", "correct": c, "maj_correct": sum(c) * 2 > k}
                                                  for i, c in enumerate(correct)]}


def test_summary_table_and_plot_on_hand_made_runs(tmp_path):
    pair = sy.PAIRS[("contrast", sy.TINY)]
    pair = dataclasses.replace(pair, eval_k=2)
    values = {("broken", 0): 0.8, ("repaired", 0): 0.0, ("broken", 1): 0.7, ("repaired", 1): 0.1, ("broken", 2): 0.9,
              ("repaired", 2): 0.0}
    records = []
    for (arm, seed), v in values.items():
        d = tmp_path / "contrast" / f"{arm}-seed{seed}"
        (d / "eval").mkdir(parents=True)
        good = arm == "repaired"
        (d / "eval" / "report.json").write_text(json.dumps(_full_report([[good, True], [good, False], [False, False]])))
        records.append(_record("contrast", arm, seed, v, d))
    base = _full_report([[False, False]] * 3)
    s = sy.summarize(pair, records, base)
    assert s["diff_per_seed"] == pytest.approx([0.8, 0.6, 0.9])
    mean, lo, hi = ladder.t_interval([0.8, 0.6, 0.9])
    assert s["diff_mean"] == pytest.approx(mean) and s["diff_ci95"] == pytest.approx([lo, hi])
    assert s["excludes_zero"] and s["in_expected_direction"] and s["broken_named"] == [True] * 3
    assert s["repaired_named"] == [False] * 3
    paired = s["heldout"]["broken-minus-repaired-seed0"]["avg@2"]  # broken 1/6 right, repaired 3/6 (paired over problems)
    assert paired["diff"] == pytest.approx(1 / 6 - 3 / 6, abs=1e-4) and paired["lo"] <= paired["diff"] <= paired["hi"]
    s |= {"command": "python bench/symptoms.py --boundary contrast", "git_commit": "abc", "steps": 2}
    md = sy.render([s], records)
    assert "| contrast | `python bench/symptoms.py --boundary contrast` |" in md and "(run here with `--steps 2`)" in md
    assert md.count("| contrast | broken |") == 3 and md.count("| contrast | repaired |") == 3  # every seed's row
    assert "| 3/3 / 0/3 |" in md and pair.why in md and "0.767 [" in md
    sy.plot(["contrast"], records, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    # a second invocation for another boundary merges into symptoms.json; running a boundary again replaces its runs
    sy.write_outputs(tmp_path, {"contrast": (s, records)})
    other = {**s, "boundary": "credit"}
    sy.write_outputs(tmp_path, {"credit": (other, [{**r, "boundary": "credit"} for r in records[:2]])})
    sy.write_outputs(tmp_path, {"contrast": (s, records[:2])})
    state = json.loads((tmp_path / "symptoms.json").read_text())
    assert set(state["pairs"]) == {"contrast", "credit"} and len(state["runs"]) == 4


def test_training_code_hash_ignores_docstrings_and_readers(tmp_path):
    for name, text in (("train.py", '"""Doc."""\nx = 1\n'), ("report.py", "y = 2\n")):
        (tmp_path / name).write_text(text)
    t0, r0 = sy.code_hashes(tmp_path)
    (tmp_path / "train.py").write_text('"""Another doc."""\nx = 1  # a comment\n')
    (tmp_path / "report.py").write_text("y = 3\n")
    t1, r1 = sy.code_hashes(tmp_path)
    assert t1 == t0 and r1 != r0  # a reader changed: report.py reruns, the training runs are kept
    (tmp_path / "train.py").write_text("x = 2\n")
    assert sy.code_hashes(tmp_path)[0] != t0


def test_exported_fixture_holds_what_the_diagnosis_reads(tmp_path):
    run = tmp_path / "credit" / "broken-seed0"
    run.mkdir(parents=True)
    cfg = dataclasses.asdict(train.Config(loss_agg="seq-mean-token-mean"))
    (run / "config.json").write_text(json.dumps({"config": cfg}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "policy/entropy": 0.1, "time/step": 1.0, "verifier/ok": 3})
                                               + "\n" for s in range(2)))
    rows = [{"step": s, "group_id": f"{s}-0", "correct": c, "response_tokens": n} for s in range(2) for c, n in ((True, 20), (False, 30))]
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = {"boundary": "credit", "arm": "broken", "seed": 0, "model": sy.TINY, "run_dir": str(run)}
    doc = json.loads(sy.export_fixture(rec, True, tmp_path / "fx").read_text())
    assert doc["diagnosis_boundary"] == "credit" and doc["symptom_shown"] and doc["config"]["loss_agg"] == "seq-mean-token-mean"
    assert doc["metrics"] == [{"step": s, "policy/entropy": 0.1, "verifier/ok": 3, "length/long_wrong_frac": 1.0} for s in range(2)]
    # A regime run with more train.py flags is kept apart from the pair's own fixtures, and says how it was run.
    tagged = sy.export_fixture(rec | {"extra_flags": ["--temperature", "1.5"]}, False, tmp_path / "fx", "t1.5")
    doc = json.loads(tagged.read_text())
    assert tagged.name == "credit-t1.5-broken-seed0.json" and doc["regime"] == "t1.5" and "-- --temperature 1.5" in doc["source"]


def test_fixtures_of_a_regime_with_extra_flags_need_a_tag(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sy.parse(["--boundary", "exploration", "--out", str(tmp_path), "--fixtures", str(tmp_path / "fx"), "--",
                  "--temperature", "1.5"])
    assert e.value.code == 2 and "--fixtures_tag" in capsys.readouterr().err
    args = sy.parse(["--boundary", "exploration", "--out", str(tmp_path), "--fixtures", str(tmp_path / "fx"),
                     "--fixtures_tag", "t1.5", "--", "--temperature", "1.5"])
    assert args.extra == ["--temperature", "1.5"] and args.fixtures_tag == "t1.5"


def test_clip_room_counts_the_positive_advantage_tokens_the_upper_bound_can_reach():
    """clip_room against the probabilities computed here, on the shipped tiny base: the share of step 0's response
    tokens with A > 0 below 1/(1 + eps) and below 0.5; a rollout of another step, with A <= 0, or whose text does not
    tokenize back to its logged counts is not counted (the last one is reported as skipped)."""
    import torch

    from plumbing import loading, policy

    base = REPO / "assets" / "tiny-base"
    tok = policy.load_tokenizer(str(base))
    prompt = "<|user|>What is 12+7?\n<|assistant|>"
    good, wrong = "2+7=9\n1+0=1\nAnswer: 19", "2+7=8\n1+0=1\nAnswer: 18"
    n = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    row = lambda resp, **kw: {"step": 0, "kept": True, "advantage": 1.0, "prompt": prompt, "response": resp,  # noqa: E731
                              "finish_reason": "stop", "prompt_tokens": n(prompt), "response_tokens": n(resp) + 1} | kw
    rollouts = [row(good), row(wrong), row(wrong, advantage=-1.0), row(wrong, step=1), row(good, response_tokens=3)]
    got = sm.clip_room(base, rollouts, temperature=1.5)
    model = loading.load_whole(str(base), torch.device("cpu")).eval()
    probs = []
    with torch.no_grad():
        for resp in (good, wrong):
            p, q = tok(prompt, add_special_tokens=False)["input_ids"], tok(resp, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            logits = model(torch.tensor([p + q])).logits[0, len(p) - 1 : -1].double() / 1.5
            probs += logits.softmax(-1)[torch.arange(len(q)), torch.tensor(q)].tolist()
    assert got["tokens"] == len(probs) == n(good) + n(wrong) + 2 and got["skipped_rollouts"] == 1
    assert got["below_1/(1+0.2)"] == pytest.approx(sum(x < 1 / 1.2 for x in probs) / len(probs))
    assert got["below_0.5"] == pytest.approx(sum(x < 0.5 for x in probs) / len(probs))
    assert 0 < got["below_0.5"] <= got["below_1/(1+0.28)"] <= got["below_1/(1+0.2)"] < 1  # the wrong digits are unlikely


def test_out_holding_the_pair_on_another_model_is_refused(tmp_path, capsys):
    # DIR/<boundary>/<arm>-seed<N>/ is per boundary: the SmolLM2 pair would overwrite the tiny runs of the same boundary.
    (tmp_path / "symptoms.json").write_text(json.dumps({"runs": {}, "pairs": {"contrast": {"model": sy.TINY}}}))
    with pytest.raises(SystemExit) as e:
        sy.main(["--boundary", "contrast", "--model", sy.SMOL, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: --out") and "another --out" in err[0]
    assert not (tmp_path / ".code").exists()  # refused before anything was copied or run
