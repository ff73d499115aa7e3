"""The documentation against the code: every metric a run logs is in docs/metrics.md and every one
there is logged by a run here or named below with the condition that logs it; every reference to a
page and section, and every relative link, resolves; docs/tests.md has a row per test file.

Kind: a documentation contract. Three short runs of the real loop (the default DAPO step with the
probe, surplus reuse and the dual clip; GSPO under the bypass objective; a generator process at lag
1) log their metrics.jsonl and summary.json; docs/metrics.md's tables are parsed into name patterns.

How a name column of docs/metrics.md is read (the page says so too): each `backticked` token is a
name; a token without "/" continues the previous name's prefix (`length/mean`, `median` =
length/median); a token starting with "_" replaces the previous name's last "_" part
(`sampler/logprob_absdiff_mean`, `_max`); `<x>` is one path segment, `*` anything, `@k` and `@j`
any number. The table of "Evaluation reports" holds the names of eval.py's report, which a run's
summary.json carries under heldout/ and heldout_after/.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

import train
from plumbing import distributed, runlog

REPO = Path(__file__).resolve().parents[1]
EVAL_SECTION = "Evaluation reports"

# Documented names that none of the runs below logs, with the condition that logs them. Each must
# still be documented and still occur, quoted, in the code (so none goes stale). The GPU memory
# names are not here: the test asks runlog.memory_metrics for them with a stand-in GPU.
NOT_IN_THESE_RUNS = {
    "groups/exhausted": "only in a step whose dynamic-sampling round budget ran out",
    "policy/nonfinite_grad_steps": "only after an optimizer step skipped for a non-finite gradient",
    "sync/logprob_gap": "the vLLM engine's check after a weight sync",
    "sync/logprob_gap_mean": "the vLLM engine's check after a weight sync",
    "sync/logprob_gap_before": "the vLLM engine's check after a weight sync",
    "sync/logprob_gap_bar": "the vLLM engine's check after a weight sync",
    "greedy_pass@1": "eval.py --greedy true", "greedy_gen_seconds": "eval.py --greedy true",
}

SMALL = ["--task_args", '{"train_size": 500}', "--steps", "2", "--eval_limit", "4", "--eval_k", "2", "--prompts_per_step", "4",
         "--gen_prompts_per_round", "6", "--mini_batch_size", "16", "--micro_batch_size", "16",
         "--probe_every", "1", "--probe_size", "4"]
RUNS = {
    "dapo": ["--max_rollout_age", "1", "--dual_clip", "3"],
    "gspo-bypass": ["--surrogate", "gspo", "--loss_agg", "seq-mean-token-mean", "--offpolicy_objective", "bypass",
                    "--eval_data", ""],
    "lag1": ["--max_policy_lag", "1", "--eval_data", ""],
}


def documented_names(text: str) -> dict[str, list[str]]:
    """{"metrics": [names], "eval": [names]} from the name column of every table of docs/metrics.md."""
    out: dict[str, list[str]] = {"metrics": [], "eval": []}
    section = "metrics"
    for line in text.splitlines():
        if line.startswith("#"):
            section = "eval" if EVAL_SECTION in line else "metrics"
        if not line.startswith("| `"):
            continue
        prev = ""
        for token in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if token.startswith("_") and prev:
                token = prev.rsplit("_", 1)[0] + token
            elif "/" not in token and prev and "/" in prev:
                token = prev.rsplit("/", 1)[0] + "/" + token
            out[section].append(token)
            prev = token
    return out


def pattern(name: str) -> re.Pattern:
    """A documented name as a regular expression over logged names."""
    rx = re.escape(name)
    rx = re.sub(r"<[^>]+>", "[^/]+", rx.replace(r"\<", "<").replace(r"\>", ">"))
    rx = rx.replace(r"\*", ".*")
    rx = re.sub(r"@[kj]\b", r"@\\d+", rx)
    return re.compile(rx + "$")


def test_parser_reads_the_page_conventions():
    names = documented_names("## A\n| name | meaning |\n|---|---|\n"
                             "| `length/mean`, `median`, `sampler/x_mean`, `_max` | m |\n"
                             "| `age/<a>/groups`, `probe/avg@k` (held-out) | m |\n"
                             "### Evaluation reports (eval.py)\n| `pass@1` .. `pass@k` | m |\n")
    assert names == {"metrics": ["length/mean", "length/median", "sampler/x_mean", "sampler/x_max", "age/<a>/groups",
                                 "probe/avg@k"], "eval": ["pass@1", "pass@k"]}
    assert pattern("age/<a>/groups").match("age/12/groups") and not pattern("age/<a>/groups").match("age/1/2/groups")
    assert pattern("probe/avg@k").match("probe/avg@32") and not pattern("probe/avg@k").match("probe/avg@k2")


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> dict[str, set[str]]:
    """The names the three runs logged: metrics.jsonl keys, and summary.json keys (about 15-45 s),
    plus the memory names a GPU run logs (runlog.memory_metrics with torch.cuda's peaks stood in)."""
    root = tmp_path_factory.mktemp("metrics_doc")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2**30)
        mp.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 2**31)
        gpu, _ = runlog.memory_metrics({"host": 1.0, "gpu": 1.0, "gpu_reserved": 2.0}, torch.device("cuda"),
                                       distributed.Dist())
    metrics, summary = set(gpu), set()
    for name, flags in RUNS.items():
        train.main(["--run_dir", str(root / name)] + SMALL + flags)
        for line in (root / name / "metrics.jsonl").read_text().splitlines():
            metrics |= set(json.loads(line))
        summary |= {k for k in json.loads((root / name / "summary.json").read_text()) if "/" in k}
    return {"metrics": metrics, "summary": summary}


def test_every_logged_metric_is_documented(logged):
    doc = documented_names((REPO / "docs" / "metrics.md").read_text())
    metric_rx, eval_rx = [pattern(n) for n in doc["metrics"]], [pattern(n) for n in doc["eval"]]
    undocumented = sorted(k for k in logged["metrics"] if not any(p.match(k) for p in metric_rx))
    assert not undocumented, f"logged to metrics.jsonl but not in docs/metrics.md: {undocumented}"
    for key in sorted(logged["summary"]):
        head, _, tail = key.partition("/")
        if head in ("heldout", "heldout_after") and any(p.match(tail) for p in eval_rx):
            continue  # an eval.py report metric
        assert any(p.match(key) for p in metric_rx), f"in summary.json but not in docs/metrics.md: {key}"


def test_every_documented_metric_is_logged(logged):
    doc = documented_names((REPO / "docs" / "metrics.md").read_text())
    heldout = {k.partition("/")[2] for k in logged["summary"] if k.startswith(("heldout/", "heldout_after/"))}
    seen = {"metrics": logged["metrics"] | logged["summary"], "eval": heldout}
    source = "\n".join(p.read_text() for d in ("", "plumbing", "evaluation", "tasks") for p in (REPO / d).glob("*.py"))
    for section, names in doc.items():
        for name in names:
            if name in NOT_IN_THESE_RUNS:
                assert f'"{name}"' in source, f"docs/metrics.md names {name!r}, which no code logs any more"
                continue
            assert any(pattern(name).match(k) for k in seen[section]), (
                f"docs/metrics.md names {name!r}, which none of the runs {sorted(RUNS)} logged: remove it, "
                "or name the condition that logs it in NOT_IN_THESE_RUNS")
    all_names = doc["metrics"] + doc["eval"]
    assert not [n for n in NOT_IN_THESE_RUNS if n not in all_names], "NOT_IN_THESE_RUNS holds names the page lost"


def test_docs_tests_page_names_every_test_file():
    page = (REPO / "docs" / "tests.md").read_text()
    missing = sorted(p.name for p in (REPO / "tests").glob("test_*.py") if f"`{p.name}`" not in page)
    assert not missing, f"docs/tests.md has no row for {missing}"


def test_every_page_and_section_reference_resolves():
    """`docs/<page>.md "<section>"` and `README "<section>"` anywhere in the repository name a heading
    that exists (a heading starting with the quoted words); every relative Markdown link names a file."""
    files = [REPO / ".ci" / "run"]
    for root, dirs, names in os.walk(REPO):  # pruned while walking: a CI venv inside the checkout holds all of torch
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("runs", "assets", "__pycache__")]
        files += [Path(root) / n for n in names if Path(n).suffix in (".py", ".md", "")]
    bad = []
    for f in files:
        text = f.read_text(errors="replace")
        for m in re.finditer(r'((?:[\w.-]+/)*[A-Za-z_]+\.md|README) "([^"]+)"', text):
            page = REPO / (m.group(1) if m.group(1).endswith(".md") else "README.md")  # a path from the repository root,
            if not page.exists() and (f.parent / m.group(1)).exists():  # else from the citing file's folder
                page = f.parent / m.group(1)
            section = " ".join(m.group(2).split())
            if section.startswith("<"):
                continue  # a placeholder, as in this docstring
            heads = [" ".join(l.lstrip("#").split()) for l in page.read_text().splitlines() if l.startswith("#")] if page.exists() else []
            if not any(h.startswith(section) for h in heads):
                bad.append(f"{f.relative_to(REPO)}: {m.group(1)} \"{section}\"")
        if f.suffix == ".md":
            bad += [f"{f.relative_to(REPO)}: link {t}" for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
                    if not t.startswith(("http://", "https://")) and not (f.parent / t).exists()]
    assert not bad, "references that resolve to no page or heading:\n" + "\n".join(bad)
