"""bench/ladder.py: the ablation ladder of the paper's Table 1.

Kinds: hand-derived values (the Student-t interval and quantiles against
tables), a property of the presets the ladder rests on (each row changes exactly one switch of
train.Config against the row above), and an end-to-end smoke run of the script itself (2 rows,
1 seed, 2 steps, a tiny evaluation, extra train flags passed through after `--`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import ladder  # noqa: E402
import train  # noqa: E402

SWITCHES = {"eps_high", "overlong_filter", "overlong_penalty", "loss_agg", "dynamic_sampling"}


def test_each_ladder_row_changes_exactly_one_switch():
    names = [name for name, _ in train.LADDER]
    assert names == list(ladder.PAPER_AIME24) and [ladder.PAPER_AIME24[n] for n in names] == [30, 36, 38, 41, 42, 50]
    configs = [dataclasses.asdict(train.Config(**train.PRESETS[n])) for n in names]
    # Row 1 is plain GRPO: every DAPO switch off.
    first = configs[0]
    assert first["eps_high"] == first["eps_low"] and not first["dynamic_sampling"] and not first["overlong_filter"]
    assert not first["overlong_penalty"] and first["loss_agg"] == "seq-mean-token-mean"
    seen = set()
    for prev, cur, name in zip(configs, configs[1:], names[1:]):
        changed = {k for k in cur if cur[k] != prev[k]}
        assert len(changed) == 1 and changed <= SWITCHES, f"{name} changes {changed}"
        assert set(ladder.preset_diff(name)) == changed
        seen |= changed
    assert seen == SWITCHES  # the ladder turns on every DAPO switch, each once
    last = configs[-1]  # and ends at DAPO as in Table 1 (overlong filtering kept)
    assert last["eps_high"] == 0.28 and last["dynamic_sampling"] and last["loss_agg"] == "token-mean"


def test_t_interval_on_hand_values():
    for df, table in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)):
        assert ladder.t_quantile(0.975, df) == pytest.approx(table, abs=1e-4)
    # values 0.2, 0.3, 0.4: mean 0.3, s = 0.1, half-width 4.302653 * 0.1 / sqrt(3) = 0.248414
    mean, lo, hi = ladder.t_interval([0.2, 0.3, 0.4])
    assert mean == pytest.approx(0.3) and lo == pytest.approx(0.3 - 0.248414, abs=1e-5)
    assert hi == pytest.approx(0.3 + 0.248414, abs=1e-5)
    assert ladder.t_interval([0.5]) == (0.5, None, None)
    mean, lo, hi = ladder.t_interval([0.25, 0.25, 0.25])
    assert lo == hi == mean == 0.25


def test_row_selection_and_passthrough():
    assert ladder.select_rows("") == [n for n, _ in train.LADDER]
    assert ladder.select_rows("6,1") == ["ladder-1-grpo", "ladder-6-dapo"]
    assert ladder.select_rows("ladder-3-clip-higher") == ["ladder-3-clip-higher"]
    assert ladder.select_rows("8,6,7") == ["ladder-6-dapo", "ladder-6-cispo", "ladder-6-gspo"]  # the successors
    with pytest.raises(ValueError, match="row number"):
        ladder.select_rows("9")
    args, extra = ladder.parse(["--preset-base", "paper", "--model", "M", "--data", "D.parquet", "--eval_data",
                                "E.parquet", "--steps", "5", "--", "--eval_k", "32", "--lr", "2e-6"])
    argv = ladder.run_argv("ladder-3-clip-higher", 1, Path("OUT"), args, extra)
    assert argv[:2] == ["--preset", "ladder-3-clip-higher"] and argv[-4:] == ["--eval_k", "32", "--lr", "2e-6"]
    assert "--max_response_len" in argv and argv[argv.index("--max_response_len") + 1] == "20480"  # paper base
    assert "--eps_high" not in argv  # the row's switches come from the row's preset, never from the base
    cfg = train.parse_config(argv)
    assert (cfg.eps_high, cfg.loss_agg, cfg.dynamic_sampling) == (0.28, "seq-mean-token-mean", False)
    assert (cfg.group_size, cfg.mini_batch_size, cfg.eval_k, cfg.lr, cfg.steps) == (16, 512, 32, 2e-6, 5)
    assert (cfg.model, cfg.data, cfg.eval_data) == ("M", "D.parquet", "E.parquet")
    tiny_args, _ = ladder.parse([])
    assert (tiny_args.max_response_len, tiny_args.overlong_buffer, tiny_args.steps, tiny_args.seeds) == (34, 6, 20, 3)


def test_ladder_smoke_run(tmp_path):
    out = tmp_path / "ladder"
    table = ladder.main(["--rows", "1,2", "--seeds", "1", "--steps", "2", "--eval_limit", "8", "--eval_k", "2",
                         "--jobs", "2", "--out", str(out), "--",
                         "--prompts_per_step", "2", "--gen_prompts_per_round", "2", "--mini_batch_size", "16",
                         "--micro_batch_size", "16"])
    assert [r["row"] for r in table] == ["ladder-1-grpo", "ladder-2-overlong-filter"]
    md, js = (out / "ladder.md").read_text(), json.loads((out / "ladder.json").read_text())
    for name in ("ladder-1-grpo", "ladder-2-overlong-filter"):
        assert f"| {name} (" in md and f"**{name}**" in md
        run = out / name / "s0"
        assert (run / "summary.json").exists() and (run / "rollouts.jsonl").exists()  # generated samples recorded
        cfg = json.loads((run / "config.json").read_text())["config"]
        assert (cfg["steps"], cfg["max_response_len"], cfg["overlong_buffer"], cfg["prompts_per_step"]) == (2, 34, 6, 2)
    assert "`overlong_filter`: False -> True" in md and "Student-t" in md
    assert [r["row"] for r in js["rows"]] == ["ladder-1-grpo", "ladder-2-overlong-filter"]
    for r in js["rows"]:
        assert 0 <= r["avg_after_mean"] <= 1 and r["avg_after_ci95"] == [None, None]  # one seed: no interval
        assert r["samples_generated"] == 2 * 2 * 8 and r["samples_trained"] == 2 * 2 * 8  # steps x prompts x G
        assert math.isfinite(r["entropy_last"]) and 0 <= r["truncated_frac_last"] <= 1
    assert js["rows"][1]["diff"] == {"overlong_filter": [False, True]}
    # A second call with the same settings reuses the finished runs instead of training again.
    again = ladder.main(["--rows", "2", "--seeds", "1", "--steps", "2", "--eval_limit", "8", "--eval_k", "2",
                         "--out", str(out), "--", "--prompts_per_step", "2", "--gen_prompts_per_round", "2",
                         "--mini_batch_size", "16", "--micro_batch_size", "16"])
    assert again[0]["wall_s"] == table[1]["wall_s"]


def test_successor_rows_are_row_6_with_one_surrogate():
    # Rows 7 and 8 are row 6 plus a surrogate (GSPO also with the aggregation it requires), not cumulative.
    assert ladder.preset_diff("ladder-6-cispo") == {"surrogate": ("clip", "cispo")}
    assert ladder.preset_diff("ladder-6-gspo") == {"surrogate": ("clip", "gspo"),
                                                   "loss_agg": ("token-mean", "seq-mean-token-mean")}
    assert ladder.base_row("ladder-6-gspo") == "ladder-6-dapo" and ladder.base_row("ladder-6-dapo") == "ladder-5-token-level"
    args, extra = ladder.parse(["--optimizer_steps", "2,8"])
    assert args.opt_steps == [2, 8]
    # 16 groups x 8 answers = 128 responses per rollout step: 8 optimizer steps = mini-batches of 16
    argv = ladder.run_argv("ladder-6-gspo", 0, Path("OUT"), args, extra, opt_steps=8)
    cfg = train.parse_config(argv)
    assert (cfg.mini_batch_size, cfg.surrogate, cfg.loss_agg) == (16, "gspo", "seq-mean-token-mean")
    with pytest.raises(ValueError, match="do not split into 3 mini-batches"):
        ladder.run_argv("ladder-6-cispo", 0, Path("OUT"), args, extra, opt_steps=3)


def test_ladder_smoke_run_of_a_successor_at_two_settings(tmp_path):
    out = tmp_path / "succ"
    table = ladder.main(["--rows", "8", "--optimizer_steps", "1,2", "--seeds", "1", "--steps", "1", "--eval_limit", "4", "--jobs", "2",
                         "--eval_k", "1", "--out", str(out), "--", "--prompts_per_step", "2", "--gen_prompts_per_round", "2",
                         "--micro_batch_size", "16"])
    assert [(r["row"], r["opt_steps"]) for r in table] == [("ladder-6-gspo", 1), ("ladder-6-gspo", 2)]
    assert [r["opt_steps_mean"] for r in table] == [1.0, 2.0]  # measured policy/optimizer_steps
    assert all(r["seq_clipfrac_low_last"] is not None and r["length_last"] > 0 for r in table)
    md = (out / "ladder.md").read_text()
    assert "**ladder-6-gspo** vs row 6 (DAPO): `loss_agg`: 'token-mean' -> 'seq-mean-token-mean'" in md
    assert md.count("| ladder-6-gspo (DAPO + GSPO) |") == 2 and (out / "ladder-6-gspo" / "os2" / "s0" / "summary.json").exists()
