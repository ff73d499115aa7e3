"""Before RL: one error the verifier detects, fixed by prompt, schema or retry, each with its cost (`eval.py fixes`).

    python eval.py fixes --preset smollm2-arith --k 4 --limit 64 --out runs/fixes [--trained runs/smollm2-arith]

The commonest failure of a real model under DAPO's instruction is not a wrong number but no
parsable final answer (a verdict in task.FORMAT_ERRORS: no "Answer:" line, several values, ...).
RL can teach the format (`python train.py --preset smollm2-arith`), but cheaper fixes come first;
this measures them on the same held-out problems, with the same model, seed and sampling:

  (a) prompt      the prompt as is (DAPO's instruction): the reference
  (b) instruction a clearer instruction (CLEARER_INSTRUCTION: one short request for the last line)
  (c) one-shot    one worked example before the problem, as an earlier chat turn (--few_shot 1)
  (d) schema      decoding constrained to end with a line "Answer: <integer>" (AnswerLineConstraint,
                  a logits processor through rollout.HFEngine's `processor` hook); the verifier then
                  reads exactly that line, so the format cannot fail
  (e) retry       the prompt as is, each answer whose format the validator rejects sampled again,
                  up to --tries samples in all; tokens and time count every try

and, with --trained RUN, the RL policy under (a)'s prompt, its training cost (samples, tokens,
seconds: frontier.training_cost) reported beside it and never added to its per-problem costs.

Written to --out: fixes.json, fixes.md (the table) and fixes.png (the figure). For each arm
fixes.json holds format_error, exact_form, avg@k, pass@k (each with a 95% bootstrap interval over
problems), tokens_per_problem and seconds_per_problem (generation wall-clock), and the paired
difference against (a) of avg@k and format_error (estimators.paired_bootstrap).

What the schema arm forbids (AnswerLineConstraint): ending anywhere but right after the answer
line's integer (the probability the policy puts on ending moves to starting that line: a newline,
then "Answer"); a line that starts with the token "Answer" going on any other way than ": ", an
optional "-" and 1 to 12 digits, then the end; and free text in the last 9 tokens of the budget,
which are kept for the line (room for a 4-digit integer, the largest answers of tasks/arith.py).
Everything before the line is the policy's own text, sampled as usual.
vLLM's structured output (a regex) cannot bound the free text by the token budget, so it could not
guarantee the line; this arm runs on the transformers engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import rollout
import task as task_mod
from evaluation import frontier
from evaluation.estimators import paired_bootstrap, problem_scores
from evaluation.measure import evaluate
from plumbing import cli, models, policy

CLEARER_INSTRUCTION = ("Solve this problem. You may think first, but end your reply with one last line written exactly "
                       "as\nAnswer: N\nwhere N is the answer as a whole number, and write nothing after it.\n\n{problem}")
ARMS = ("prompt", "instruction", "one-shot", "schema", "retry")
MAX_DIGITS = 12  # the schema arm's longest integer


@dataclass(frozen=True)
class Settings:
    """What the task and the report read (the fields of eval.ModelSettings that a preset sets)."""

    model: str
    max_response_len: int
    instruction: str = "dapo"
    few_shot: str = ""
    verifier: str = "dapo"
    max_prompt_len: int = 2048
    prompt_truncation: str = "error"
    skip_bad_rows: bool = False
    seed: int = 0


class AnswerLineConstraint:
    """A logits processor (rollout.HFEngine's `processor` hook) under which every response ends with a
    line "Answer: <integer>" and the end-of-sequence token (module docstring: what it forbids).

    Stateless: each call reads the phase of every row from its generated tokens, so rows may leave
    the batch between calls. tokenizer: the model's (its "\\n", "Answer", ":", " ", "-" and digit
    tokens must be single tokens, as in SmolLM2's); stop_ids: the engine's end tokens.

    Raises ValueError: a tokenizer that spells those pieces otherwise, or max_new_tokens < 6.
    """

    RESERVE = 9  # "\\n", "Answer", ":", " ", four digits, the end

    def __init__(self, tokenizer, stop_ids: list[int], max_new_tokens: int):
        ids, digits = self.check(tokenizer, max_new_tokens)
        self.nl, self.answer, self.colon, self.space, self.minus = (ids[p][0] for p in ("\n", "Answer", ":", " ", "-"))
        self.digits = [d[0] for d in digits]
        self.end = stop_ids[0]
        self.stop_ids, self.max_new_tokens = list(stop_ids), max_new_tokens

    @classmethod
    def check(cls, tokenizer, max_new_tokens: int) -> tuple[dict, list]:
        """Whether the constraint can work with this tokenizer and budget (`eval.py fixes` asks before any
        generation); returns the pieces' token ids ({piece: [id]}, [[id] per digit]). Raises ValueError."""
        ids = {piece: tokenizer.encode(piece, add_special_tokens=False) for piece in ("\n", "Answer", ":", " ", "-")}
        digits = [tokenizer.encode(str(d), add_special_tokens=False) for d in range(10)]
        if any(len(v) != 1 for v in [*ids.values(), *digits]) or tokenizer.encode(
                "\nAnswer: 12", add_special_tokens=False) != [ids[p][0] for p in ("\n", "Answer", ":", " ")] + [digits[1][0],
                                                                                                             digits[2][0]]:
            raise ValueError("the schema constraint needs a tokenizer that writes '\\n', 'Answer', ':', ' ', '-' and each "
                             "digit as single tokens, and '\\nAnswer: 12' as those pieces")
        if max_new_tokens < cls.RESERVE:
            raise ValueError(f"the schema constraint needs a response budget of at least {cls.RESERVE} tokens, got "
                             f"{max_new_tokens}")
        return ids, digits

    def allowed(self, generated: list[int]) -> list[int] | None:
        """The tokens allowed next after `generated` (None: any but the end tokens, whose mass moves to
        the answer line's next token, see __call__)."""
        left = self.max_new_tokens - len(generated)  # tokens still to generate, this one included
        starts = [i for i, t in enumerate(generated) if t == self.answer and (i == 0 or generated[i - 1] == self.nl)]
        if not starts:  # free text
            if left <= self.RESERVE:  # keep the last tokens for the line
                return [self.answer] if generated and generated[-1] == self.nl else [self.nl]
            return None
        tail = generated[starts[-1] + 1:]  # after "Answer" at a line start
        if not tail:
            return [self.colon]
        if len(tail) == 1:
            return [self.space]
        number = tail[2:]
        n_digits = sum(t in self.digits for t in number)
        if not n_digits:
            return self.digits + ([self.minus] if not number and left >= 3 else [])
        return [self.end] + (self.digits if n_digits < MAX_DIGITS and left >= 2 else [])  # left 1: the end

    def __call__(self, generated: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """generated: (A, t) long, the rows' response tokens so far; scores: (A, V). Returns new scores."""
        out = torch.full_like(scores, float("-inf"))
        stops = torch.tensor(self.stop_ids, device=scores.device)
        for r, row in enumerate(generated.tolist()):
            allowed = self.allowed(row)
            if allowed is None:  # free: ending means starting the answer line
                out[r] = scores[r]
                nxt = self.answer if row and row[-1] == self.nl else self.nl
                out[r, nxt] = torch.logsumexp(torch.stack([scores[r, nxt], torch.logsumexp(scores[r, stops], 0)]), 0)
                out[r, stops] = float("-inf")
            else:
                idx = torch.tensor(allowed, device=scores.device)
                out[r, idx] = scores[r, idx]
                if not torch.isfinite(out[r]).any():  # the policy gives every allowed token probability 0
                    out[r, idx] = 0.0
        return out


class FinalLineTask(task_mod.Task):
    """The task, scored on the response's last line only: the schema arm's verifier reads exactly the line
    the constraint wrote, nothing the free text before it says."""

    def __init__(self, inner: task_mod.Task):
        self.inner = inner

    def score(self, responses, problem, cfg):
        return self.inner.score([r.rstrip().split("\n")[-1] for r in responses], problem, cfg)

    def exact_form(self, response, cfg):
        return self.inner.exact_form(response, cfg)

    def template_hash(self, tokenizer, cfg):
        return self.inner.template_hash(tokenizer, cfg)


class RetryEngine(rollout.Engine):
    """An engine that samples again each answer whose format the validator rejects (a verdict in
    task.FORMAT_ERRORS against a stand-in ground truth: the validator never sees the answer), up to
    `tries` samples per answer in all. Counts every generated token in `tokens` and the tries in `tries_used`."""

    def __init__(self, inner, tokenizer, task: task_mod.Task, cfg, tries: int):
        super().__init__()
        self.inner, self.tokenizer, self.task, self.cfg, self.tries = inner, tokenizer, task, cfg, tries
        self.name, self.version, self.seeded, self.tp = f"{inner.name}+retry", inner.version, inner.seeded, inner.tp
        self.tokens, self.tries_used = 0, []

    def valid(self, sample) -> bool:
        text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        stand_in = task_mod.Problem("format-check", [], "0")
        return self.task.verdicts([text], stand_in, self.cfg)[0].reason not in task_mod.FORMAT_ERRORS

    def generate(self, prompts, params):
        out = self.inner.generate(prompts, params)  # [P][n]
        self.tokens += sum(len(s.token_ids) for g in out for s in g)
        used = [[1] * params.n for _ in prompts]
        for t in range(1, self.tries):
            todo = [(i, j) for i, g in enumerate(out) for j, s in enumerate(g) if not self.valid(s)]
            if not todo:
                break
            again = self.inner.generate([prompts[i] for i, _ in todo],
                                        dataclasses.replace(params, n=1, seed=params.seed + 7919 * t))
            for (i, j), (s,) in zip(todo, again):
                out[i][j] = s
                used[i][j] += 1
                self.tokens += len(s.token_ids)
        self.tries_used += [u for row in used for u in row]
        return out


def arm_summary(res: dict, k: int) -> dict:
    """The figures of one arm from an evaluate result (evaluation/measure.py): {name: value}, {name: [lo, hi]}."""
    m, ci = res["metrics"], res["ci"]
    keep = ("format_error", "exact_form", f"avg@{k}", f"pass@{k}", "tokens_per_problem", "seconds_per_problem")
    return {n: m[n] for n in keep}, {n: ci[n] for n in keep if n in ci}


def main(argv: list[str], *, presets: dict[str, dict]) -> dict:
    """`eval.py fixes ...` (module docstring). presets: the train.py presets that name a model ({name: values};
    passed in: this package never imports the commands). Returns the fixes.json dict."""
    ap = cli.ArgumentParser(prog="eval.py fixes", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(presets), required=True, help="model, data and response budget of train.py's "
                    "preset of that name")
    ap.add_argument("--k", type=int, default=4, help="samples per problem")
    ap.add_argument("--limit", type=int, default=64, help="held-out problems")
    ap.add_argument("--out", required=True, help="directory for fixes.json and fixes.md")
    ap.add_argument("--tries", type=int, default=4, help="(e) retry: samples per answer at most, the first included")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the arms to run (prompt always runs)")
    ap.add_argument("--trained", default="", help="a run directory of train.py (its final/): the RL policy beside the arms")
    ap.add_argument("--model", default="", help="another model than the preset's (HF directory or a plumbing/models.py name)")
    ap.add_argument("--max_new_tokens", type=int, default=0, help="response budget; 0 = the preset's")
    ap.add_argument("--top_p", type=float, default=0.0, help="sampling top_p; 0 = the preset's evaluation top_p")
    ap.add_argument("--seed", type=int, default=0, help="sampler and bootstrap seed")
    ap.add_argument("--n_boot", type=int, default=2000)
    args = ap.parse_args(argv)
    if args.k < 1 or args.limit < 1 or args.tries < 1 or args.max_new_tokens < 0 or not 0 <= args.top_p <= 1:
        raise ValueError("eval.py fixes needs --k, --limit, --tries >= 1, --max_new_tokens >= 0 and --top_p in [0, 1]")
    preset = presets[args.preset]
    model_dir = models.resolve(args.model or preset["model"])
    max_new = args.max_new_tokens or preset.get("max_response_len", 48)
    top_p = args.top_p or preset.get("eval_top_p", 0.7)
    trained = _trained_dir(args.trained) if args.trained else None
    torch.set_num_threads(1)
    tokenizer = policy.load_tokenizer(model_dir)
    task = task_mod.load_task(task_mod.task_spec(preset.get("task", ""), preset["data"]), preset.get("task_args", "{}"))
    base = Settings(model=model_dir, max_response_len=max_new, seed=args.seed)
    arms = {"prompt": base, "instruction": dataclasses.replace(base, instruction=CLEARER_INSTRUCTION),
            "one-shot": dataclasses.replace(base, few_shot="1"), "schema": base, "retry": base}
    data = {name: task.load(preset["data"], tokenizer, arms[name], held_out=True, limit=args.limit)
            for name in ARMS if name == "prompt" or name in args.arms}  # the one-shot arm's example too
    extra = preconditions(args, tokenizer, max_new, trained)  # every arm's, before the model loads and any generation
    model = policy.load_model(model_dir, torch.device("cpu"))
    engine = rollout.HFEngine(model, tokenizer, return_logprobs=False)
    params = rollout.SamplingParams(n=args.k, max_new_tokens=max_new, temperature=1.0, top_p=top_p, seed=args.seed)
    run = lambda eng, name, t: evaluate(eng, tokenizer, data[name], params, arms[name], t, n_boot=args.n_boot,  # noqa: E731
                                        keep_samples=True)
    results = {}
    for name in data:
        print(f"[fixes] arm {name}", flush=True)
        if name == "schema":
            engine.processor = AnswerLineConstraint(tokenizer, engine.stop_ids, max_new)
            results[name] = run(engine, name, FinalLineTask(task))
            engine.processor = None
        elif name == "retry":
            retry = RetryEngine(engine, tokenizer, task, arms[name], args.tries)
            results[name] = run(retry, name, task)
            extra[name] = {"tries": args.tries, "mean_tries": float(np.mean(retry.tries_used)),
                           "tokens_per_problem_all_tries": retry.tokens / len(data[name])}
        else:
            results[name] = run(engine, name, task)
    if trained is not None:
        print(f"[fixes] the RL policy {trained}", flush=True)
        rl_model = policy.load_model(str(trained), torch.device("cpu"))
        results["rl"] = run(rollout.HFEngine(rl_model, tokenizer, return_logprobs=False), "prompt", task)
    out = build(results, extra, args, model_dir, max_new, top_p)
    write(out, Path(args.out))
    print(markdown(out))
    return out


def preconditions(args, tokenizer, max_new: int, trained: Path | None) -> dict:
    """What each arm needs, checked before any generation (a refusal after the arms before it would lose their work):
    the output folder writable and matplotlib for fixes.png; the schema arm a tokenizer it can constrain and a budget
    that holds its line (AnswerLineConstraint.check); the RL policy (--trained) the base model's vocabulary, and its
    training cost readable. Returns the RL arm's extra figures ({} without --trained). Raises ValueError / OSError."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # a file in its place: FileExistsError, one line
    if not os.access(out, os.W_OK):
        raise PermissionError(f"--out {out}: the folder is not writable, so fixes.json could not be written")
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError("eval.py fixes draws fixes.png with matplotlib, which is not installed: pip install matplotlib")
    if "schema" in args.arms:
        try:
            AnswerLineConstraint.check(tokenizer, max_new)
        except ValueError as e:
            raise ValueError(f"eval.py fixes, the schema arm: {e}; pass --max_new_tokens >= {AnswerLineConstraint.RESERVE} "
                             "and a model whose tokenizer fits, or --arms without schema") from None
    if trained is None:
        return {}
    has_own = any((trained / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))
    if has_own and policy.load_tokenizer(str(trained)).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"--trained {trained}: its tokenizer is not the base model's, which the RL arm decodes its answers "
                         "with: pass a run trained from that model (--model, or the preset's)")
    return {"rl": {"model": str(trained), "training_cost": frontier.training_cost(str(trained))}}


def _trained_dir(spec: str) -> Path:
    path = Path(spec)
    path = path / "final" if (path / "final" / "config.json").exists() else path
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"--trained {spec!r}: no config.json there; pass the run directory of train.py (its final/)")
    return path


def build(results: dict, extra: dict, args, model_dir: str, max_new: int, top_p: float) -> dict:
    """fixes.json: settings, one entry per arm (figures, intervals, paired differences against the prompt arm)."""
    k = args.k
    ref = problem_scores(results["prompt"]["per_problem"])
    arms = {}
    for name, res in results.items():
        figures, ci = arm_summary(res, k)
        if name == "retry":  # every try's tokens count, not only the kept answer's
            figures["tokens_per_problem"] = extra[name]["tokens_per_problem_all_tries"]
            ci.pop("tokens_per_problem", None)
        mine = problem_scores(res["per_problem"])
        paired = {} if name == "prompt" else {
            m: paired_bootstrap(mine[m], ref[m], n_boot=args.n_boot, level=0.95, seed=args.seed)
            for m in (f"avg@{k}", "format_error")}
        arms[name] = {**figures, "ci": ci, "vs_prompt": paired, **extra.get(name, {}),
                      "instruction": res["settings"]["instruction"], "few_shot": res["settings"]["few_shot"],
                      "engine": res["settings"]["engine"]}
    return {"settings": {"preset": args.preset, "model": model_dir, "k": k, "n_problems": results["prompt"]["settings"]["n_problems"],
                         "max_new_tokens": max_new, "temperature": 1.0, "top_p": top_p, "seed": args.seed,
                         "tries": args.tries, "dataset": results["prompt"]["settings"].get("template_hash"),
                         "verifier": results["prompt"]["settings"]["verifier"], "commit": policy.repo_commit()},
            "arms": arms}


def markdown(out: dict) -> str:
    """fixes.md: one row per arm."""
    s, k = out["settings"], out["settings"]["k"]
    f = lambda a, m: f"{a[m]:.3f}" + (f" [{a['ci'][m][0]:.3f}, {a['ci'][m][1]:.3f}]" if m in a["ci"] else "")  # noqa: E731
    d = lambda a, m: (f"{a['vs_prompt'][m]['diff']:+.3f} [{a['vs_prompt'][m]['lo']:+.3f}, {a['vs_prompt'][m]['hi']:+.3f}]"  # noqa: E731
                      if m in a["vs_prompt"] else "")
    rows = [f"# Fixes of one format error ({s['n_problems']} held-out problems, k = {k}, T 1.0, top_p {s['top_p']}, "
            f"<= {s['max_new_tokens']} tokens, model {s['model']}, commit {s['commit']})", "",
            f"| arm | format error | exact form | avg@{k} | pass@{k} | avg@{k} - (a) | format error - (a) | tokens / problem | "
            "s / problem |", "|---|---|---|---|---|---|---|---:|---:|"]
    for name, a in out["arms"].items():
        rows.append(f"| {name} | {f(a, 'format_error')} | {f(a, 'exact_form')} | {f(a, f'avg@{k}')} | {f(a, f'pass@{k}')} | "
                    f"{d(a, f'avg@{k}')} | {d(a, 'format_error')} | {a['tokens_per_problem']:.1f} | {a['seconds_per_problem']:.2f} |")
    if "rl" in out["arms"] and out["arms"]["rl"].get("training_cost"):
        c = out["arms"]["rl"]["training_cost"]
        rows += ["", f"RL training cost, once, not in the per-problem costs: {c['steps']} rollout steps, "
                 f"{c['samples_generated']} samples, {c['generated_tokens']} generated tokens, {c['seconds']} s"]
    return "\n".join(rows) + "\n"


def plot(out: dict, path: Path) -> None:
    """fixes.png: per arm, the format-error rate and avg@k with their 95% intervals, and tokens per problem."""
    import matplotlib  # optional heavy dependency: only this function draws

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    k, arms = out["settings"]["k"], out["arms"]
    names = list(arms)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, metric, title in zip(axes, ("format_error", f"avg@{k}", "tokens_per_problem"),
                                 ("format error (no parsable answer)", f"accuracy, avg@{k}", "generated tokens per problem")):
        vals = [arms[n][metric] for n in names]
        err = [[v - arms[n]["ci"].get(metric, [v, v])[0] for n, v in zip(names, vals)],
               [arms[n]["ci"].get(metric, [v, v])[1] - v for n, v in zip(names, vals)]]
        ax.bar(names, vals, yerr=err, capsize=3, color=["#888888" if n == "prompt" else "#cc6633" if n == "rl" else "#3366aa"
                                                         for n in names])
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle(f"{out['settings']['n_problems']} held-out problems, k = {k}; RL (orange) also cost its training, reported apart",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write(out: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fixes.json").write_text(json.dumps(out, indent=2) + "\n")
    (folder / "fixes.md").write_text(markdown(out))
    plot(out, folder / "fixes.png")
