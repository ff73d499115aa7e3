"""Tasks shipped with the repository, each a subclass of task.Task (task.py: the interface a fork implements).

    tiny.py         the built-in toy task: column addition with a character tokenizer; what
                    `python train.py` trains on
    arith.py        integer arithmetic for real tokenizers under the DAPO instruction (--data arith), what
                    train.py's smollm2-arith preset trains on
    tiny_base.py    builds the tiny base policy shipped in assets/tiny-base
                    (`python -m tasks.tiny_base`)

A fork's task can live anywhere importable and is chosen with `--task module:Class` (docs/forking.md).
Where a new module goes: a task here; machinery the loop calls in plumbing/; a measurement in
evaluation/; the repository root keeps only the algorithm's components and the commands people type.
"""
