"""Building the tiny base policy: a fresh 1.23M-parameter Qwen2 model warmed up on the tiny task, saved in assets/tiny-base.

    python -m tasks.tiny_base                    # rebuild assets/tiny-base (about two minutes on 2 CPU cores)
    python -m tasks.tiny_base --out DIR --steps 20

The task, tokenizer and paraphrases it trains on are tasks/tiny.py's. This file is apart from tasks/tiny.py
because it needs what the trainer and the evaluator define (the settings a checkpoint carries),
while the trainer itself imports tasks/tiny.py: keeping the two apart keeps the imports one-way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import eval as ev
import train
from plumbing.policy import save_plain_tokenizer
from tasks.tiny import ASSET_DIR, TASK_VERSION, build_tokenizer, make_split


def build_model(vocab_size: int, seed: int = 0):
    """Qwen2-architecture decoder, 1.23M parameters (3 layers, width 192, tied embeddings)."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=192, intermediate_size=512, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None,
        torch_dtype="float32",
    )
    return Qwen2ForCausalLM(cfg)


def build_base(out_dir: Path, *, steps: int = 275, seed: int = 0, batch_size: int = 64, lr: float = 3e-3,
               direct_share: float = 0.0, loop_share: float = 0.0) -> dict:
    """Supervised warm-up of a fresh tiny model on training problems, then save it as HF format.

    Stops by step count, not accuracy: held-out accuracy jumps sharply within a few steps during
    this warm-up, so a fixed step count is the reproducible stopping rule. The defaults (275 steps,
    lr 3e-3, no other forms) are the ones the shipped assets/tiny-base was built with (its build.json).
    direct_share / loop_share: that share of the warm-up targets in another form (`target_forms`): a
    base that sometimes answers without its working, or sometimes loops, for bench/symptoms.py.
    Returns a summary dict written to out_dir/build.json; out_dir/dapo_run.json records the prompt,
    budget and answer-rule settings evaluation must reuse (write_run_settings).
    """
    tok = build_tokenizer()
    model = build_model(len(tok), seed)
    rows = target_forms(make_split(steps * batch_size, held_out=False, seed=seed + 1), direct_share, loop_share, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    t0 = time.time()
    model.train()
    for step in range(steps):
        batch = rows[step * batch_size : (step + 1) * batch_size]
        ids, labels = [], []
        for r in batch:
            p = tok.apply_chat_template([{"role": "user", "content": r["problem"]}], add_generation_prompt=True, tokenize=False)
            p_ids = tok(p, add_special_tokens=False)["input_ids"]
            s_ids = tok(r["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids.append(p_ids + s_ids)
            labels.append([-100] * len(p_ids) + s_ids)
        L = max(map(len, ids))
        x = torch.tensor([i + [tok.pad_token_id] * (L - len(i)) for i in ids])  # (B, L) right-padded
        y = torch.tensor([l + [-100] * (L - len(l)) for l in labels])  # (B, L)
        lr_now = lr * min(1.0, (step + 1) / 20)
        for g in opt.param_groups:
            g["lr"] = lr_now
        loss = model(input_ids=x, attention_mask=(x != tok.pad_token_id).long(), labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            print(f"sft step {step:4d} loss {loss.item():.4f} ({time.time() - t0:.0f}s)", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_plain_tokenizer(tok, out_dir)
    summary = {"task_version": TASK_VERSION, "sft_steps": steps, "seed": seed, "batch_size": batch_size,
               "lr": lr, "seconds": round(time.time() - t0, 1), "final_sft_loss": round(loss.item(), 4)}
    if direct_share or loop_share:  # the shipped base's build.json stays as it was
        summary |= {"direct_share": direct_share, "loop_share": loop_share}
    (out_dir / "build.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_run_settings(out_dir)
    return summary


def target_forms(rows: list[dict], direct_share: float, loop_share: float, seed: int = 0) -> list[dict]:
    """The warm-up rows with that share of their targets rewritten in one of two other forms (new dicts).

    direct: "Answer: N" alone, no column lines: a short answer the 1.23M policy gets right far less
        often (it adds in one go), which any token budget fits. A policy that has both forms can answer
        long problems short and unreasoned, or reasoned and long: what a budget's pressure acts on.
    loop: one column line written again 1-3 more times before the next ("4+8+1=13" twice): a longer
        answer with a repetition in it, its answer still right. The shipped base never writes either.
    Each row draws its form from random.Random(seed + 2); with both shares 0 nothing is drawn and the rows
    are returned as they are (the shipped base). Raises ValueError: a share outside [0, 1] or summing above 1.
    """
    if not (0 <= direct_share <= 1 and 0 <= loop_share <= 1 and direct_share + loop_share <= 1):
        raise ValueError(f"--direct_share {direct_share} and --loop_share {loop_share} must be in [0, 1] with a sum <= 1")
    if not (direct_share or loop_share):
        return rows
    rng, out = random.Random(seed + 2), []
    for r in rows:
        u, lines = rng.random(), r["solution"].split("\n")
        if u < direct_share:
            r = {**r, "solution": lines[-1]}
        elif u < direct_share + loop_share:
            i, times = rng.randrange(len(lines) - 1), rng.randint(1, 3)
            r = {**r, "solution": "\n".join(lines[: i + 1] + [lines[i]] * times + lines[i + 1 :])}
        out.append(r)
    return out


def write_run_settings(out_dir: Path) -> None:
    """out_dir/dapo_run.json: the settings eval.py reads back from a checkpoint (the fields of
    eval.ModelSettings), here train.Config's defaults, the settings `python train.py` starts with."""
    fields = [f.name for f in dataclasses.fields(ev.ModelSettings) if f.name not in ("model", "trust_remote_code")]
    config = {k: getattr(train.Config(), k) for k in fields}
    note = "the tiny base policy (tasks/tiny_base.py); the prompt, budget and answer rule of train.Config's defaults"
    (Path(out_dir) / "dapo_run.json").write_text(json.dumps({"note": note, "config": config}, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ASSET_DIR)
    ap.add_argument("--steps", type=int, default=275, help="supervised steps (batch 64); 275 gives a policy right ~40%% of the time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (the shipped base: 3e-3)")
    ap.add_argument("--direct_share", type=float, default=0.0, help="share of targets that are 'Answer: N' alone, no "
                    "column lines (the shipped base: 0; bench/symptoms.py's budget pair)")
    ap.add_argument("--loop_share", type=float, default=0.0, help="share of targets with one column line written 1-3 "
                    "more times (the shipped base: 0; bench/symptoms.py's credit pair)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(build_base(args.out, steps=args.steps, seed=args.seed, lr=args.lr, direct_share=args.direct_share,
                                loop_share=args.loop_share), indent=2))


if __name__ == "__main__":
    main()
