"""Pre-flight: sample the starting policy on a fixed set of training prompts and write a hand-check sheet, before training.

    python preflight.py                                             # the tiny default, in seconds
    python preflight.py --model DIR --data DATA.parquet --preset paper --out runs/preflight
    python preflight.py --n 100 --group_size 8 --out runs/preflight  # every train.py setting it uses is a flag

Why: the reward is the one thing RL cannot question. Before spending compute, save answers of the
starting policy to about 100 fixed training prompts and read a sample by hand: is each verdict
right, is the answer format what the verifier expects, how much of the batch will dynamic
sampling throw away, and does the length budget fit. This command samples them with the training
settings (G answers per prompt, the response budget, temperature, top_p, the verifier mode of
train.Config and its --preset), scores them with the task's reward (task.Task.score) and with the
other verifier modes, and writes to --out:

  sheet.md        counts, then the answers a human should read first: where the verifier modes
                  disagree (dapo vs math vs the official rule), unusual verdict reasons or answer
                  routes (evaluation/audit.py), the longest answers, then one plain answer per prompt
  preflight.json  the counts, settings, data hash and prompt-set hash (the ids of the prompts)
  answers.jsonl   every answer with its verdict in each mode

The prompt set is fixed by the data: the n problems whose sha256 of (id, messages, answer) is
smallest, so every run on the same data gets the same set (its hash is recorded), whatever the
seed, the model or the order of the rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

import dapo
import rollout
import train  # Config, its presets and defaults: the pre-flight checks the settings a run will use
import verifier
from plumbing import cli, distributed, policy
from evaluation import audit
from rollout import SamplingParams
from task import Task, dedupe_by_id, task_of, task_spec

# train.Config fields the pre-flight reads; each is a flag, defaulting to the preset's value.
SHARED = ("model", "data", "group_size", "max_response_len", "overlong_penalty", "overlong_buffer", "overlong_factor",
          "temperature", "top_p", "verifier", "instruction", "max_prompt_len", "prompt_truncation", "skip_bad_rows", "seed",
          "task", "task_args", "engine", "engine_max_batch", "device", "threads", "trust_remote_code")
PLAIN_REASONS = ("ok", "wrong")  # every other verifier reason is "unusual" and goes to the top of the sheet
N_LONGEST = 5  # the longest answers listed on the sheet (after disagreements and unusual answers)


def parse_args(argv: list[str] | None) -> tuple[train.Config, argparse.Namespace]:
    """(the train.Config a run would use: --preset, then flags; the pre-flight's own flags n, show, out)."""
    ap = cli.ArgumentParser(prog="preflight.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(train.PRESETS), default="tiny", help="train.py's starting values; flags override")
    ap.add_argument("--n", type=int, default=100, help="prompts in the fixed set (default 100)")
    ap.add_argument("--show", type=int, default=40, help="answers listed for hand-checking on the sheet (default 40)")
    ap.add_argument("--out", default="runs/preflight", help="output directory (default runs/preflight)")
    fields = {f.name: f for f in dataclasses.fields(train.Config)}
    for name in SHARED:
        f = fields[name]
        is_bool = f.type in ("bool", bool)
        ap.add_argument(f"--{name}", type=cli.parse_bool if is_bool else type(f.default), default=None,
                        metavar="BOOL" if is_bool else None,
                        help=f"{f.metadata['help']} (default: the preset's; tiny {f.default!r})".replace("%", "%%"))
    args = ap.parse_args(argv)
    values = {**train.PRESETS[args.preset], **{k: getattr(args, k) for k in SHARED if getattr(args, k) is not None}}
    cfg = train.Config(**values)
    if not cfg.data:
        raise ValueError(f"--preset {args.preset} names no data: pass --data (a DAPO .parquet or a .jsonl)")
    if args.n < 1:
        raise ValueError(f"--n must be >= 1 prompt, got {args.n}")
    if args.show < 0:
        raise ValueError(f"--show must be >= 0 answers, got {args.show}")
    # train.py's rules on the settings a run would use; the batch layout is the trainer's business (no flag here), so
    # it is checked as one group per mini-batch, which every group size divides
    cli.check_config(dataclasses.replace(cfg, mini_batch_size=cfg.group_size, micro_batch_size=cfg.group_size))
    task_of(cfg)  # a --task that cannot be built stops here
    return cfg, args


def select_prompts(problems: list, n: int) -> list:
    """The fixed prompt set: the n distinct problems (by id) with the smallest sha256 of (id, messages,
    answer), in that order. Depends only on the data: not on the seed, the model or the row order."""
    key = lambda p: hashlib.sha256(json.dumps([p.id, p.messages, p.answer]).encode()).hexdigest()  # noqa: E731
    return sorted(dedupe_by_id(problems), key=key)[:n]


def set_hash(problems: list) -> str:
    """sha256[:16] of the prompt set: (id, messages, answer) of each problem, in set order."""
    return hashlib.sha256(json.dumps([[p.id, p.messages, p.answer] for p in problems]).encode()).hexdigest()[:16]


def score_answers(problems, samples, texts, cfg, task: Task) -> list[dict]:
    """One record per answer: the task's verdict (cfg.verifier), every other mode's (only for a task that
    scores with verifier.py: a fork's own reward has no modes to compare), the answer route, format
    errors and the soft overlong punishment (paper eq. 13) it would get."""
    modes = type(task).score is Task.score  # the task's reward is verifier.py's rule
    out = []
    for p, group, group_texts in zip(problems, samples, texts):
        lengths = torch.tensor([len(s.token_ids) for s in group])  # (G,)
        over = (dapo.overlong_penalty(lengths, max_len=cfg.max_response_len, buffer_len=cfg.overlong_buffer,
                                      penalty_factor=cfg.overlong_factor) if cfg.overlong_penalty else torch.zeros(len(group)))
        for i, (s, text, sc) in enumerate(zip(group, group_texts, task.verdicts(group_texts, p, cfg))):
            others = audit.other_verdicts(text, p.answer, cfg.verifier) if modes else {}
            markers = audit.answer_markers(text)
            fmt = (["no_answer_line"] if markers == 0 else []) + (
                ["several_candidates"] if sc.reason == "multiple_answers" or markers > 1 else []) + (["truncated"] if s.truncated else [])
            out.append({"prompt_id": p.id, "sample_index": i, "ground_truth": p.answer, "response": text,
                        "tokens": len(s.token_ids), "finish_reason": s.finish_reason, "truncated": s.truncated,
                        "correct": sc.correct, "pred": sc.pred, "reason": sc.reason, "detail": sc.detail,
                        "reward_overlong": float(over[i]), "route": audit.route(text, sc.pred) if sc.pred else [],
                        "format": fmt, "other": {m: None if o is None else {"correct": o.correct, "pred": o.pred, "reason": o.reason}
                                                 for m, o in others.items()}})
    return out


def summarize(answers: list[dict], cfg, rule: str | None = None) -> dict:
    """Counts: verdict reasons, format errors, mode agreement, uniform groups, lengths against the budget.
    rule: the name of the verdict's rule (default cfg.verifier)."""
    n = len(answers)
    by_prompt: dict[str, list] = {}
    for a in answers:
        by_prompt.setdefault(a["prompt_id"], []).append(a["correct"])
    right = [sum(c) for c in by_prompt.values()]
    G = cfg.group_size
    groups = {"prompts": len(right), "all_correct": sum(r == G for r in right) / len(right),
              "all_wrong": sum(r == 0 for r in right) / len(right), "mixed": sum(0 < r < G for r in right) / len(right),
              "dropped_by_dynamic_sampling": sum(r in (0, G) for r in right) / len(right)}
    modes = {rule or cfg.verifier: {"correct_frac": float(np.mean([a["correct"] for a in answers])), "disagree": 0,
                                    "not_comparable": 0}}
    for m in verifier.MODES:
        if m != cfg.verifier and all(m in a["other"] for a in answers):
            judged = [a for a in answers if a["other"][m] is not None]
            modes[m] = {"correct_frac": float(np.mean([a["other"][m]["correct"] for a in judged])) if judged else None,
                        "disagree": sum(a["other"][m]["correct"] != a["correct"] for a in judged),
                        "not_comparable": n - len(judged)}
    lens = np.array([a["tokens"] for a in answers])  # (n,)
    trunc = np.array([a["truncated"] for a in answers], dtype=bool)  # (n,)
    correct = np.array([a["correct"] for a in answers], dtype=bool)  # (n,)
    L, buf = cfg.max_response_len, cfg.overlong_buffer if cfg.overlong_penalty else 0
    edges = [round((L - buf) * q / 4) for q in range(5)]
    sels = [(f"[{lo}, {hi})", ~trunc & (lens >= lo) & (lens < hi)) for lo, hi in zip(edges[:-1], edges[1:])]
    sels[-1] = (f"[{edges[3]}, {edges[4]}]", ~trunc & (lens >= edges[3]) & (lens <= edges[4]))
    if buf:
        sels.append((f"overlong buffer ({L - buf}, {L}], punished", ~trunc & (lens > L - buf)))
    sels.append((f"truncated (hit {L})", trunc))
    lengths = {"min": int(lens.min()), "median": float(np.median(lens)), "mean": float(lens.mean()),
               "p90": float(np.quantile(lens, 0.9)), "max": int(lens.max()), "budget": L, "buffer": buf,
               "punished_frac": float(np.mean([a["reward_overlong"] < 0 for a in answers])),
               "mean_overlong_penalty": float(np.mean([a["reward_overlong"] for a in answers])),
               "bins": [{"bin": name, "answers": int(s.sum()), "share": float(s.mean()),
                         "accuracy": float(correct[s].mean()) if s.any() else None} for name, s in sels]}
    fmt = Counter(f for a in answers for f in a["format"])
    return {"answers": n, "reasons": dict(Counter(a["reason"] for a in answers).most_common()),
            "format_errors": {f: fmt[f] for f in ("no_answer_line", "several_candidates", "truncated")},
            "routes": dict(Counter(r for a in answers for r in a["route"])), "modes": modes, "groups": groups, "lengths": lengths}


def to_check(answers: list[dict], show: int) -> list[tuple[int, list[str]]]:
    """The answers a human should read, in order: [(answer index, reasons it is listed)].

    Order: verifier modes disagree; an unusual reason (not ok / wrong) or answer route, rarest first;
    the N_LONGEST longest; then one plain answer per prompt. Identical texts of one prompt are listed
    once. At most `show` entries.
    """
    why: dict[int, list[str]] = {}
    seen: set = set()
    first_of = {}
    for i, a in enumerate(answers):
        first_of.setdefault((a["prompt_id"], a["response"]), i)
    rarity = Counter(a["reason"] for a in answers) + Counter(r for a in answers for r in a["route"])

    def add(i: int, reason: str) -> None:
        i = first_of[(answers[i]["prompt_id"], answers[i]["response"])]
        why.setdefault(i, [])
        if reason not in why[i]:
            why[i].append(reason)
        seen.add(i)

    for i, a in enumerate(answers):
        for m, o in a["other"].items():
            if o is not None and o["correct"] != a["correct"]:
                add(i, f"modes disagree: {m} says {'right' if o['correct'] else 'wrong'}")
    unusual = [(rarity[a["reason"]], i, f"reason {a['reason']}") for i, a in enumerate(answers) if a["reason"] not in PLAIN_REASONS]
    unusual += [(rarity[r], i, f"route {r}") for i, a in enumerate(answers) for r in a["route"]]
    for _, i, reason in sorted(unusual):
        add(i, reason)
    for i in sorted(range(len(answers)), key=lambda i: (-answers[i]["tokens"], i))[:N_LONGEST]:
        add(i, f"longest ({answers[i]['tokens']} tokens)")
    listed = {answers[i]["prompt_id"] for i in why}
    for i, a in enumerate(answers):
        if a["prompt_id"] not in listed:
            listed.add(a["prompt_id"])
            add(i, "plain sample")
    return list(why.items())[:show]


def _frac(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _fence(text: str) -> str:
    """A fenced block that holds `text` whatever backticks it contains."""
    fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def render_sheet(res: dict, answers: list[dict], prompts: dict[str, str]) -> str:
    """sheet.md: settings, counts, then the answers to check, each with boxes to tick."""
    s, c = res["settings"], res["counts"]
    out = ["# Pre-flight sheet: the starting policy on a fixed set of training prompts", "",
           "Read the listed answers; tick each box or note what is wrong. A verdict the verifier gets wrong here is a reward "
           "the policy will be trained on (verifier.py; docs/evaluation.md).", "", "## Settings", ""]
    out += [f"- {k}: `{v}`" for k, v in s.items()]
    out += ["", "## Verdicts (" + s["verifier"] + " mode)", "", "| reason | answers | share | meaning |", "|---|---:|---:|---|"]
    out += [f"| {r} | {k} | {k / c['answers']:.3f} | {verifier.REASON_DOCS.get(r, '')} |" for r, k in c["reasons"].items()]
    out += ["", "## Format errors", "", "| error | answers | share |", "|---|---:|---:|"]
    out += [f"| {f} | {k} | {k / c['answers']:.3f} |" for f, k in c["format_errors"].items()]
    out += ["", "no_answer_line: no 'Answer:' marker (a \\boxed{} may still be scored); several_candidates: two or more "
            "markers, or the verifier's multiple_answers; truncated: hit the response budget."]
    routes = ", ".join(f"{r} {k}" for r, k in c["routes"].items()) or "all plain"
    out += ["", f"Answer routes of the extracted answers (evaluation/audit.py): {routes}"]
    out += ["", "## Verifier modes", "", f"| mode | correct frac | disagrees with {s['verifier']} | cannot judge |", "|---|---:|---:|---:|"]
    out += [f"| {m} | {_frac(v['correct_frac'])} | {v['disagree']} | {v['not_comparable']} |" for m, v in c["modes"].items()]
    g = c["groups"]
    cost = f": each kept group costs {1 / g['mixed']:.1f} generated." if g["mixed"] else ": none would be kept, training cannot start."
    out += ["", "## Groups (what dynamic sampling keeps)", "",
            f"Of {g['prompts']} prompts x G={s['group_size']}: all right {g['all_correct']:.3f}, all wrong {g['all_wrong']:.3f}, "
            f"mixed {g['mixed']:.3f}. Dynamic sampling drops {g['dropped_by_dynamic_sampling']:.3f} of generated groups{cost}"]
    ln = c["lengths"]
    out += ["", "## Response length against the budget", "",
            f"tokens: min {ln['min']}, median {ln['median']:.0f}, mean {ln['mean']:.1f}, p90 {ln['p90']:.0f}, max {ln['max']}; "
            f"budget {ln['budget']}, overlong buffer {ln['buffer']}; punished by the soft overlong term: {ln['punished_frac']:.3f} "
            f"(mean penalty {ln['mean_overlong_penalty']:.3f})", "",
            "| length (tokens) | answers | share | accuracy |", "|---|---:|---:|---:|"]
    out += [f"| {b['bin']} | {b['answers']} | {b['share']:.3f} | {_frac(b['accuracy'])} |" for b in ln["bins"]]
    out += ["", f"## Answers to check ({len(res['sheet'])}, most important first)", ""]
    copies = Counter((a["prompt_id"], a["response"]) for a in answers)
    for n, (i, why) in enumerate(res["sheet"], 1):
        a = answers[i]
        verdict = lambda o: f"{'right' if o['correct'] else 'wrong'} ({o['reason']}, pred {o['pred']!r})"  # noqa: E731
        verdicts = [f"{s['verifier']}: {verdict(a)}"] + [f"{m}: {'cannot judge' if o is None else verdict(o)}"
                                                        for m, o in a["other"].items()]
        same = copies[(a["prompt_id"], a["response"])]
        out += [f"### {n}. {'; '.join(why)}", "",
                f"- problem `{a['prompt_id']}`, ground truth `{a['ground_truth']}`; {a['tokens']} tokens ({a['finish_reason']})"
                + (f"; {same} identical answers in its group" if same > 1 else "")
                + (f"; format: {', '.join(a['format'])}" if a["format"] else ""),
                f"- verdicts: {'; '.join(verdicts)}", "- [ ] verdict right   [ ] format right   note:", "",
                "prompt (end):", "", _fence(audit.clip(prompts[a["prompt_id"]], 400)), "",
                "response:", "", _fence(audit.clip(a["response"], 3000)), ""]
    return "\n".join(out) + "\n"


def preflight(cfg: train.Config, n: int, show: int, out: str | Path) -> dict:
    """Sample, score, count and write sheet.md, preflight.json and answers.jsonl to `out`; returns preflight.json's dict.

    Raises:
        FileNotFoundError / ValueError: as task.Task.read and policy.load_tokenizer (bad data, model),
            or a prompt longer than --max_prompt_len under --prompt_truncation error.
    """
    distributed.seed_everything(cfg.seed, cfg.threads)
    task, cfg = task_of(cfg)
    tokenizer = policy.load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    rows, name, data_hash = task.read(cfg.data, cfg, held_out=False)
    chosen, prompts, too_long = [], [], 0
    for p in select_prompts(rows, n):
        ids = task.build_prompt(p, tokenizer, cfg)
        if len(ids) > cfg.max_prompt_len:
            if cfg.prompt_truncation == "error":
                raise ValueError(f"problem {p.id}: {len(ids)} prompt tokens, over --max_prompt_len {cfg.max_prompt_len}; raise it "
                                 "or pass --prompt_truncation left or skip")
            too_long += 1
            continue
        chosen.append(p)
        prompts.append(ids)
    _, device = distributed.init_distributed(cfg.device)
    engine_name = rollout.resolve_engine(cfg.engine)
    model_dir = cfg.model or str(policy.DEFAULT_MODEL)
    model = policy.load_model(cfg.model, device, trust_remote_code=cfg.trust_remote_code) if engine_name == "hf" else None
    engine = policy.build_engine(engine_name, model=model, tokenizer=tokenizer, model_dir=model_dir, device=device, seed=cfg.seed,
                                 max_model_len=policy.engine_max_len(cfg.model, max(map(len, prompts)) + cfg.max_response_len),
                                 sampler_logprobs=False, max_batch=cfg.engine_max_batch)
    params = SamplingParams(n=cfg.group_size, max_new_tokens=cfg.max_response_len, temperature=cfg.temperature, top_p=cfg.top_p,
                            seed=cfg.seed)
    samples, gen_s = rollout.timed_generate(engine, prompts, params)  # (P, G) Samples
    texts = [[tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in group] for group in samples]
    answers = score_answers(chosen, samples, texts, cfg, task)
    rule = cfg.verifier if type(task).score is Task.score else f"{type(task).__name__}.score"  # a fork's own reward
    settings = {"model": cfg.model or "assets/tiny-base", "task": task_spec(cfg.task, cfg.data), "task_args": cfg.task_args,
                "data": name, "dataset_hash": data_hash, "prompt_set_hash": set_hash(chosen),
                "prompts": len(chosen), "prompts_too_long_skipped": too_long,
                "prompt_rule": "the n problems with the smallest sha256 of (id, messages, answer)",
                "template_hash": task.template_hash(tokenizer, cfg), "group_size": cfg.group_size,
                "max_response_len": cfg.max_response_len, "overlong_buffer": cfg.overlong_buffer if cfg.overlong_penalty else 0,
                "temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed, "verifier": rule,
                "verifier_version": verifier.VERSION, "engine": f"{engine.name} {engine.version}", "gen_seconds": round(gen_s, 2),
                "commit": policy.repo_commit()}
    res = {"settings": settings, "prompt_ids": [p.id for p in chosen], "counts": summarize(answers, cfg, rule),
           "sheet": to_check(answers, show)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prompt_text = {p.id: tokenizer.decode(ids, skip_special_tokens=False) for p, ids in zip(chosen, prompts)}
    (out / "sheet.md").write_text(render_sheet(res, answers, prompt_text))
    (out / "preflight.json").write_text(json.dumps(res, indent=2) + "\n")
    with open(out / "answers.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(a, ensure_ascii=False) + "\n" for a in answers)
    return res


def main(argv: list[str] | None = None) -> dict:
    """`python preflight.py [flags]`: run the pre-flight and print its counts."""
    cfg, args = parse_args(argv)
    res = preflight(cfg, args.n, args.show, args.out)
    s, c = res["settings"], res["counts"]
    g, ln = c["groups"], c["lengths"]
    print(f"{s['prompts']} prompts x G={s['group_size']} from {s['data']} (data {s['dataset_hash']}, prompt set {s['prompt_set_hash']}), "
          f"{s['gen_seconds']} s")
    print(f"verdicts ({s['verifier']}): " + ", ".join(f"{r} {k}" for r, k in c["reasons"].items()))
    print("format errors (DAPO's 'Answer:' rule): " + ", ".join(f"{f} {k}" for f, k in c["format_errors"].items()))
    print("modes: " + ", ".join(f"{m} correct {'-' if v['correct_frac'] is None else format(v['correct_frac'], '.3f')}"
                                + (f" (disagrees on {v['disagree']})" if m != s["verifier"] else "") for m, v in c["modes"].items()))
    print(f"groups: all right {g['all_correct']:.3f}, all wrong {g['all_wrong']:.3f}: dynamic sampling drops "
          f"{g['dropped_by_dynamic_sampling']:.3f}")
    print(f"length: median {ln['median']:.0f}, p90 {ln['p90']:.0f}, max {ln['max']} of {ln['budget']} tokens; punished by the "
          f"overlong buffer {ln['punished_frac']:.3f}, truncated {c['format_errors']['truncated'] / c['answers']:.3f}")
    print(f"wrote {args.out}/sheet.md ({len(res['sheet'])} answers to check), preflight.json, answers.jsonl")
    return res


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
