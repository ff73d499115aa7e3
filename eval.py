"""Measuring a model: avg@k, unbiased pass@k, maj@k, greedy pass@1, cost, diversity, and exactly what was measured.

    python eval.py --data tiny --k 4                                  # the tiny base policy, tiny task
    python eval.py --model runs/default --data tiny --k 4 --out runs/default/eval
    python eval.py --model DIR --data tests/fixtures/aime2024_dapo_eval.parquet --verifier dapo-official --out OUT
    torchrun --nproc_per_node=8 eval.py --model DIR --data tests/fixtures/aime2024_dapo_eval.parquet --out OUT
    torchrun --nproc_per_node=8 eval.py --engine vllm --vllm_tp 8 --model DIR --data ... --out OUT   # one 8-GPU engine
    python eval.py compare A/report.json B/report.json                # paired: does A beat B?
    python eval.py frontier --models assets/tiny-base runs/default --k 1 2 4 8 16 32 --limit 256 --out DIR
                                                  # more samples of the base or the trained policy? (evaluation/frontier.py)
    python eval.py fixes --preset smollm2-arith --k 4 --limit 64 --out DIR [--trained RUN]
                                                  # before RL: prompt, schema and retry fixes of the format (evaluation/fixes.py)

Reading a training run (plots, diagnosis) is report.py's job; this file is the command that measures a
model (the measurement itself, which train.py's held-out and probe numbers share: evaluation/measure.py).

What the paper measured (paper section 4.1 and Table 1): avg@32 on AIME 2024, the mean accuracy
over 32 sampled answers per problem (temperature 1.0, top_p 0.7; the official file repeats each of
the 30 problems 32 times and scores one sample per row, which is the same number; that file is
committed as tests/fixtures/aime2024_dapo_eval.parquet). avg@k is not greedy pass@1 and not
pass@k. Here:

  * avg@k: mean of the (problems, k) correctness matrix.
  * pass@j, for every j <= k: the unbiased estimator 1 - C(n - c, j) / C(n, j) with n = k samples
    per problem (Chen et al., 2021, arXiv 2107.03374, eq. 1), never the biased "first j samples"
    count (docs/PITFALLS.md, failure 11). pass@1 equals avg@k by construction.
  * maj@k: majority vote over the extracted answers, answers the verifier judges equal voting
    together (measure.same_answer, estimators.answer_classes; tie rule in estimators.MAJ_TIE_RULE).
  * greedy_pass@1: one more generation pass at temperature 0 (`--greedy true`, the default).
  * cost: generated tokens per problem (mean, p90), per sample (mean_length), sampling wall-clock
    per problem; diversity: distinct final answers per problem, the entropy of the answers, the
    share of duplicate responses (estimators.diversity_curve).
  * a 95% bootstrap interval over problems for each, and `compare` for a paired difference.

Prompts are rebuilt from what the checkpoint saved (final/dapo_run.json: instruction, verifier,
max_response_len, max_prompt_len, prompt_truncation), never from this file's defaults; flags
override and the report says which. When the model's run trained on problems of --data (the
same text), stderr says so and the report's settings count them (trained_problems). The same
task.Task scores here and in training.

How this file departs from the paper's evaluation (each is recorded in the report's settings):
  1. The verifier is the checkpoint's (default "dapo", verifier.py's fixed rule). The paper scored
     with the official rule: pass --verifier dapo-official to compare with its table; the report
     lists every setting that differs from the paper's protocol.
  2. Problems are deduplicated by id and k samples drawn per problem, instead of one sample per
     repeated row; for the official AIME file (32 rows per id) and k = 32 the estimator is the same.
  3. pass@j, maj@k, greedy pass@1 and the intervals are additions; the paper reports avg@32 only.
  4. Under torchrun engine group g generates problems g::groups with its own seed (`distributed.rank_seed`;
     a group is one rank, or --vllm_tp ranks sharing one tensor-parallel vLLM engine), so the
     drawn samples depend on the number of groups (not on anything else).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import rollout
import verifier
from rollout import SamplingParams
from task import load_task, task_spec
from evaluation import compare, fixes, frontier, overlap, paraphrase, reports
from evaluation.measure import evaluate
from evaluation.estimators import (MAJ_TIE_RULE, answer_classes, avg_at_k, bootstrap_ci, maj_at_k, majority_vote,  # noqa: F401
                                   paired_bootstrap, pass_at_k, problem_scores)
from plumbing import checkpoints, cli, distributed, models, policy
from plumbing.cli import F
from plumbing.distributed import Dist

DEFAULT_MODEL = policy.DEFAULT_MODEL


# --- plumbing: config ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalConfig:
    """Every setting of `python eval.py`. Empty / 0 means "what the checkpoint saved"."""

    model: str = F("", "HF model directory or a run directory (its final/ is used); '' = assets/tiny-base")
    data: str = F("", "a name the task generates ('tiny'), a .parquet (DAPO layout) or a .jsonl with problem/answer; "
                  "'' = the checkpoint's --eval_data ('tiny' without one)")
    task: str = F("", "module:Class of the task that scores the answers (train.py --task); '' = the checkpoint's, else "
                  "the task that generates --data, else task:Task")
    task_args: str = F("", "the task's options, a JSON object ('' = the checkpoint's with its task, else {})")
    k: int = F(32, "[k] samples per problem (paper: 32 on AIME 2024)")
    temperature: float = F(1.0, "sampling temperature (paper evaluation 1.0)")
    top_p: float = F(0.7, "nucleus top_p (paper evaluation 0.7)")
    max_new_tokens: int = F(0, "response budget in tokens; 0 = the checkpoint's max_response_len (paper 20480)")
    max_prompt_len: int = F(0, "prompt budget in tokens; 0 = the checkpoint's. A longer prompt follows --prompt_truncation")
    prompt_truncation: str = F("", "a prompt over the budget: error, left (the start of the problem's text is cut), skip "
                                   "(dropped, counted); '' = the checkpoint's")
    instruction: str = F("", "'dapo' | 'none' | a template holding {problem}; '' = the checkpoint's")
    few_shot: str = F("", "worked examples before each problem: N (the task's own) or a .jsonl of {problem, response}; "
                      "'' = the checkpoint's")
    verifier: str = F("", f"answer rule, one of {verifier.MODES}; '' = the checkpoint's (paper: dapo-official)")
    limit: int = F(0, "evaluate the first N distinct problems (0 = the checkpoint's --eval_limit on its own --eval_data, "
                      "else all)")
    seed: int = F(0, "seeds the sampler (per rank, see rank_seed) and the bootstrap")
    greedy: bool = F(True, "also decode greedily (temperature 0) for greedy_pass@1")
    engine: str = F("hf", "hf | vllm | auto (vllm when `import vllm` works, else hf): the same rule and default as train.py")
    vllm_tp: int = F(1, "--engine vllm under torchrun: N consecutive ranks run one tensor-parallel engine; problems are "
                     "split across these groups (as train.py --vllm_tp)")
    engine_max_batch: int = F(256, "--engine hf: sequences decoded together (a memory knob: each sequence draws from "
                              "a seeded stream of its own, so samples do not change beyond float rounding)")
    device: str = F("auto", "auto | cpu | cuda (hf engine)")
    threads: int = F(1, "torch CPU threads (1: one thread per process is fastest on a shared CPU)")
    trust_remote_code: bool = F(False, "run model code from the model directory (never taken from a saved config)")
    n_boot: int = F(compare.N_BOOT, "bootstrap resamples of the problems for each interval")
    ci_level: float = F(compare.CI_LEVEL, "coverage of the bootstrap intervals")
    paraphrases: str = F("", "also score paraphrases of the problems, same settings, and report the gap with a paired interval: "
                              "'tiny' (tasks/tiny.py's rewordings; 'tiny:K' the first K styles) or a .jsonl of {id, problem|prompt} "
                              "(evaluation/paraphrase.py); '' = off")
    out: str = F("", "directory for report.json and report.md ('' = print only)")


def parse_args(argv: list[str] | None, prog: str | None = None) -> EvalConfig:
    """EvalConfig from the command line, checked (`check_eval_config`); prog names the command in errors."""
    ap = cli.ArgumentParser(prog=prog, usage="%(prog)s [--FLAG VALUE ...]   (measure a model; every flag below)\n"
                            "       %(prog)s compare A/report.json B/report.json [--n_boot N] [--ci_level L] [--seed S]\n"
                            "       %(prog)s frontier --models BASE TRAINED... --k 1 2 4 ... --out DIR [--FLAG VALUE ...]",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_dataclass_flags(ap, EvalConfig, defaults=True)
    cfg = EvalConfig(**vars(ap.parse_args(argv)))
    check_eval_config(cfg)
    return cfg


def check_eval_config(c: EvalConfig) -> None:
    """Refuse flags that cannot mean anything, before any work: one line naming the flag and the fix.

    The flags eval.py shares with train.py follow cli.check_config's rules and wording (a sampled
    evaluation may be greedy, so --temperature 0 is allowed here); tests/test_eval.py has one row
    per rule. Raises ValueError: the first rule broken.
    """
    for fails, message in _eval_rules(c):  # in order: a later rule may assume an earlier one holds
        if fails:
            raise ValueError(message)


def _eval_rules(c: EvalConfig):
    """(fails, message) for each rule of check_eval_config, lazily."""
    yield (c.k < 1, f"--k must be >= 1 sample per problem, got {c.k}")
    yield (c.limit < 0, f"--limit must be >= 0 (0 = all problems), got {c.limit}")
    yield (not 0 <= c.temperature < math.inf, f"--temperature must be >= 0 (0 = greedy), got {c.temperature}")
    yield (not 0 < c.top_p <= 1, f"--top_p must be in (0, 1] (1 = off, paper evaluation 0.7), got {c.top_p}: top_p 0 "
           "keeps no token (use --temperature 0 for greedy decoding)")
    yield (c.max_new_tokens < 0, f"--max_new_tokens must be >= 0 (0 = the checkpoint's max_response_len), got {c.max_new_tokens}")
    yield (c.max_prompt_len < 0, f"--max_prompt_len must be >= 0 (0 = the checkpoint's), got {c.max_prompt_len}")
    yield (c.prompt_truncation not in ("", "error", "left", "skip"),
           f"--prompt_truncation must be error, left or skip ('' = the checkpoint's), got {c.prompt_truncation!r}")
    yield from cli.instruction_rules(c.instruction, c.few_shot, allow_empty=True)
    yield (c.verifier not in ("", *verifier.MODES), f"--verifier must be one of {verifier.MODES} ('' = the checkpoint's), "
           f"got {c.verifier!r}")
    yield (c.engine not in rollout.ENGINES, f"--engine must be auto, hf or vllm, got {c.engine!r}")
    yield (c.vllm_tp < 1, f"--vllm_tp must be >= 1, got {c.vllm_tp}")
    yield (c.engine_max_batch < 1, f"--engine_max_batch must be >= 1, got {c.engine_max_batch}")
    yield (c.device not in ("auto", "cpu", "cuda"), f"--device must be auto, cpu or cuda, got {c.device!r}")
    yield (c.device == "cuda" and not torch.cuda.is_available(),
           "--device cuda but torch sees no CUDA device: use --device cpu (or auto), or a CUDA build of torch")
    yield (c.threads < 1, f"--threads must be >= 1 torch CPU thread, got {c.threads}")
    yield from compare.bootstrap_rules(c.n_boot, c.ci_level, c.seed)


# --- plumbing: inputs ----------------------------------------------------------------------------------


def resolve_model(spec: str) -> Path:
    """The HF model directory: '' is the tiny base policy; a run directory means its final/; a name of
    plumbing/models.py (smollm2-135m-instruct) its converted copy. Raises FileNotFoundError."""
    path = Path(models.resolve(spec)) if spec else DEFAULT_MODEL
    if (path / "final" / "dapo_run.json").exists():
        path = path / "final"
    elif unfinished := checkpoints.unfinished_model(path):  # a run's final/ cut short (a full disk), or not written yet
        raise FileNotFoundError(f"--model {spec}: {unfinished}")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"--model {spec or str(path)!r}: no config.json there; pass an HF model directory or a run "
                                f"directory holding final/ (the shipped base policy is {DEFAULT_MODEL.relative_to(policy.REPO)}, built by `python -m tasks.tiny_base`)")
    return path


@dataclass(frozen=True)
class ModelSettings:
    """What a checkpoint was trained with and its evaluation must reuse: the prompt, the response
    budget and the answer rule (final/dapo_run.json "config"; field names and defaults as
    train.Config's, checked by tests/test_eval.py), with eval flags applied on top."""

    model: str
    max_response_len: int = 48
    max_prompt_len: int = 2048
    prompt_truncation: str = "error"
    instruction: str = "dapo"
    few_shot: str = ""
    verifier: str = "dapo"
    skip_bad_rows: bool = False
    seed: int = 0
    task: str = ""
    task_args: str = "{}"
    data: str = "tiny"
    eval_data: str = "tiny"
    eval_limit: int = 256
    trust_remote_code: bool = False


def checkpoint_settings(model_dir: Path, ecfg: EvalConfig) -> tuple[ModelSettings, str]:
    """The checkpoint's ModelSettings (its dapo_run.json), eval flags applied on top.

    Returns (settings, where they came from). The shipped tiny base carries a dapo_run.json too.

    Raises:
        ValueError: no dapo_run.json and no --max_new_tokens (the response budget is unknown; the
            paper used 20480), or an unknown --verifier.
    """
    saved = model_dir / "dapo_run.json"
    fields = {f.name for f in dataclasses.fields(ModelSettings)}
    if saved.exists():
        config = checkpoints.upgrade_config(json.loads(saved.read_text())["config"])  # a run from before --task: the same run
        base = {k: v for k, v in config.items() if k in fields}
        source = str(saved)
    elif ecfg.max_new_tokens:
        base, source = {}, "defaults (no dapo_run.json)"
    else:
        raise ValueError(f"{model_dir} has no dapo_run.json, so its response budget is unknown: pass --max_new_tokens "
                         f"(paper 20480) and check --instruction / --verifier")
    overrides = {"max_response_len": ecfg.max_new_tokens, "max_prompt_len": ecfg.max_prompt_len,
                 "prompt_truncation": ecfg.prompt_truncation, "instruction": ecfg.instruction, "few_shot": ecfg.few_shot,
                 "verifier": ecfg.verifier}
    base.update({k: v for k, v in overrides.items() if v})
    # a JSON file must never switch on running model code: only the flag does
    base.update(model=str(model_dir), seed=ecfg.seed, trust_remote_code=ecfg.trust_remote_code)
    settings = ModelSettings(**base)
    if settings.verifier not in verifier.MODES:
        raise ValueError(f"--verifier must be one of {verifier.MODES}, got {settings.verifier!r}")
    return settings, source


def make_engine(name: str, model_dir: Path, settings: ModelSettings, ecfg: EvalConfig, device, world: int = 1):
    """(engine, tokenizer) for --engine (rollout.resolve_engine: the same rule as train.py).

    hf loads the model here; vllm loads it inside the engine, holding the prompt + response budget
    in tokens, capped at the model's position limit, tensor-parallel over --vllm_tp consecutive
    ranks, vLLM in bf16 on GPU. Neither engine applies the sampling fields of generation_config.json
    (answers are sampled at --temperature and --top_p only); the ignored fields are named on stderr."""
    name = rollout.resolve_engine(name)
    tokenizer = policy.load_tokenizer(str(model_dir), trust_remote_code=settings.trust_remote_code)
    model = policy.load_model(str(model_dir), device, trust_remote_code=settings.trust_remote_code,
                                world=world) if name == "hf" else None  # under torchrun: FSDP2 shards, no whole copy
    max_len = policy.engine_max_len(str(model_dir), settings.max_prompt_len + settings.max_response_len)
    engine = policy.build_engine(name, model=model, tokenizer=tokenizer, model_dir=model_dir, device=device, seed=ecfg.seed,
                                 max_model_len=max_len, max_batch=ecfg.engine_max_batch, temperature=ecfg.temperature,
                                 top_p=ecfg.top_p, sampler_logprobs=False, tp=ecfg.vllm_tp, world=world,
                                 dtype=policy.engine_dtype(device))  # bf16 on GPU, as training's sampler
    return engine, tokenizer


def measure(ecfg: EvalConfig, dist: Dist, device) -> dict:
    """evaluate() on --model and --data, then on the paraphrases (--paraphrases), with one engine.

    Both passes run before the engine is closed (and the caller closes the process group after
    that), so the paraphrase pass has its engine and, under torchrun, its collectives. Returns
    evaluate's result with the data's settings and, with paraphrases, "paraphrase" (paraphrase.gaps).
    """
    model_dir = resolve_model(ecfg.model)
    settings, source = checkpoint_settings(model_dir, ecfg)
    distributed.engine_groups(dist.world, ecfg.vllm_tp)  # a --vllm_tp that does not divide the processes fails here
    spec = ecfg.data or settings.eval_data or "tiny"
    # the task: --task, else the checkpoint's, else the one that generates --data; the checkpoint's options go with its task
    name = task_spec(ecfg.task or settings.task, spec)
    task = load_task(name, ecfg.task_args or (settings.task_args if name == task_spec(settings.task, settings.data) else "{}"))
    tokenizer = policy.load_tokenizer(str(model_dir), trust_remote_code=settings.trust_remote_code)
    limit = ecfg.limit or (settings.eval_limit if spec == settings.eval_data else 0)  # the run's held-out set
    data = task.load(spec, tokenizer, settings, held_out=True, limit=limit, flag="--data")  # before the model
    trained = overlap.trained_on(model_dir, data, settings)  # problems of --data its run trained on (said on stderr)
    para = paraphrase.load(ecfg.paraphrases, data, tokenizer, settings, task) if ecfg.paraphrases else None
    engine, tokenizer = make_engine(ecfg.engine, model_dir, settings, ecfg, device, world=dist.world)
    params = SamplingParams(n=ecfg.k, max_new_tokens=settings.max_response_len, temperature=ecfg.temperature,
                            top_p=ecfg.top_p, seed=ecfg.seed)
    run = lambda d: evaluate(engine, tokenizer, d, params, settings, task, dist=dist, greedy=ecfg.greedy,  # noqa: E731
                             n_boot=ecfg.n_boot, ci_level=ecfg.ci_level, keep_samples=True)  # the texts, to read
    try:
        res = run(data)
        if para:  # the same settings (and seed) on the paraphrases
            res["paraphrase"] = paraphrase.gaps(para, res, run(para["data"]), params, greedy=ecfg.greedy,
                                                n_boot=ecfg.n_boot, ci_level=ecfg.ci_level)
    finally:  # the engine before the process group: its shutdown needs the group
        engine.close()
    res["settings"].update(config_source=source, task=f"{type(task).__module__}:{type(task).__qualname__}",
                           dataset=data.name, dataset_hash=data.hash, **data.info, trained_problems=trained)
    return res


def frontier_main(argv: list[str]) -> dict | None:
    """`eval.py frontier --models BASE TRAINED... --k 1 2 4 ... --out DIR [eval flags]` (evaluation/frontier.py).

    Each --models entry (an HF model directory, a run directory, or the report.json of an earlier
    measurement with at least max(--k) samples per problem) is sampled once at k = max(--k) with
    the other flags (as `python eval.py`; --greedy defaults to false here), its report written to
    DIR/<name>/; frontier.build derives every smaller budget from those samples.

    Raises:
        ValueError / FileNotFoundError: a bad --models entry (named), a bad --k, or eval.py's errors.
    """
    ap = cli.ArgumentParser(prog="eval.py frontier", description=frontier.__doc__, allow_abbrev=False,  # --model is eval's
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", required=True, help="the base policy first, then trained ones: HF model "
                    "directories, run directories, or report.json files of eval.py")
    ap.add_argument("--k", nargs="+", type=int, required=True, help="rollout budgets, e.g. 1 2 4 8 16 32")
    ap.add_argument("--out", required=True, help="directory for frontier.json, frontier.md, frontier.png and the reports; "
                    "every other flag is `python eval.py`'s (--data, --limit, --temperature, ...), the same for every model")
    args, rest = ap.parse_known_args(argv)
    frontier.check_budgets(args.k)
    ecfg = parse_args(["--greedy", "false", *rest, "--k", str(max(args.k))], prog="eval.py frontier")
    if ecfg.model or ecfg.out or ecfg.paraphrases:
        raise ValueError("eval.py frontier takes its models from --models and its output directory from --out; "
                         "drop --model, --paraphrases and eval.py's own --out")
    names = frontier.names(args.models)
    sources = []  # (report path or None, model directory or None) per entry, all checked before any sampling
    for i, spec in enumerate(args.models, 1):
        if spec.endswith(".json"):
            sources.append((compare.read_report(spec, f"--models entry {i}"), None))
            continue
        try:
            sources.append((None, resolve_model(spec)))
        except FileNotFoundError:
            raise FileNotFoundError(f"--models entry {i} {spec!r}: no config.json there; pass an HF model directory, a run "
                                    f"directory holding final/ (the shipped base policy: {DEFAULT_MODEL.relative_to(policy.REPO)}), or a report.json "
                                    "of eval.py") from None
    torch.set_num_threads(ecfg.threads)
    dist, device = distributed.init_distributed(ecfg.device)
    measured = []  # one report per --models entry (not `reports`: that is the module)
    try:
        for name, (rep, model_dir) in zip(names, sources):
            if rep is None:
                rep = measure(dataclasses.replace(ecfg, model=str(model_dir)), dist, device)
                if dist.main:
                    reports.write_report(rep, Path(args.out) / name)
            measured.append(rep)
    finally:
        distributed.close_distributed(dist)
    if not dist.main:
        return None
    costs = [frontier.training_cost(rep["settings"]["model"]) for rep in measured]
    res = frontier.build(measured, names, sorted(set(args.k)), costs,
                         n_boot=ecfg.n_boot, level=ecfg.ci_level, seed=ecfg.seed)
    print(frontier.markdown(res))
    print("wrote " + ", ".join(str(p) for p in frontier.write(res, args.out)))
    return res


def main(argv: list[str] | None = None) -> dict | None:
    """`python eval.py [flags]` measures a model; `eval.py compare A B` compares two reports; `eval.py frontier`
    (evaluation/frontier.py); `eval.py fixes` (evaluation/fixes.py)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        return compare.main(argv[1:])
    if argv[:1] == ["frontier"]:
        return frontier_main(argv[1:])
    if argv[:1] == ["fixes"]:  # before RL: prompt, schema and retry fixes of the format (evaluation/fixes.py)
        import train  # for this subcommand only: it starts from one of train.py's presets, those that name a model

        return fixes.main(argv[1:], presets={name: p for name, p in train.PRESETS.items() if "model" in p})
    ecfg = parse_args(argv)
    torch.set_num_threads(ecfg.threads)
    dist, device = distributed.init_distributed(ecfg.device)  # torchrun: one process per device, problems split by `shard`
    try:
        res = measure(ecfg, dist, device)
    finally:
        distributed.close_distributed(dist)
    if not dist.main:
        return None
    for m, v in res["metrics"].items():
        interval = f"  [{res['ci'][m][0]:.3f}, {res['ci'][m][1]:.3f}]" if m in res["ci"] else ""
        print(f"{m:>23}: {reports.fmt(v)}{interval}")
    print(json.dumps(res["settings"], indent=2))
    for d in reports.paper_deviations(res["settings"]):
        print(f"differs from the paper's protocol: {d}")
    if "paraphrase" in res:
        print("\n".join(paraphrase.summary_lines(res["paraphrase"])))
    if ecfg.out:
        reports.write_report(res, ecfg.out)
        print(f"wrote {ecfg.out}/report.json and report.md")
    return res


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
