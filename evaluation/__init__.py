"""The measurements behind eval.py, report.py and preflight.py: estimators and the tools built on them.

    estimators.py   avg@k, unbiased pass@k, maj@k, answer classes, diversity, bootstrap intervals
    compare.py      two reports on the same problems, paired (`python eval.py compare`)
    frontier.py     more samples of the base policy or training, at equal generated tokens
                    (`python eval.py frontier`)
    audit.py        a stratified sample of rewarded answers for a human, and flags on reward hacks
    diagnosis.py    which of DAPO's four boundaries a run crossed, from its metrics.jsonl (report.py's diagnosis)
    paraphrase.py   the same problems in other words, scored beside the originals
    fixes.py        before RL: a format error fixed by prompt, schema or retry, with costs (`python eval.py fixes`)
    reports.py      an evaluation report on disk (report.json, report.md) and the paper's protocol it is
                    compared with

The commands stay at the repository root (eval.py, report.py, preflight.py); these modules never
import them (tests/test_layout.py). Where a new module goes: here if it measures a model or a run; in
plumbing/ if it is machinery the loop calls; in tasks/ if it is a task; at the root only if it is one
of the algorithm's components or a command a user types.
"""
