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


def build_base(out_dir: Path, *, steps: int = 275, seed: int = 0, batch_size: int = 64, lr: float = 3e-3) -> dict:
    """Supervised warm-up of a fresh tiny model on training problems, then save it as HF format.

    Stops by step count, not accuracy: held-out accuracy jumps sharply within a few steps during
    this warm-up, so a fixed step count is the reproducible stopping rule. The defaults (275 steps,
    lr 3e-3) are the ones the shipped assets/tiny-base was built with (its build.json). Returns a
    summary dict written to out_dir/build.json; out_dir/dapo_run.json records the prompt, budget
    and answer-rule settings evaluation must reuse (write_run_settings).
    """
    tok = build_tokenizer()
    model = build_model(len(tok), seed)
    rows = make_split(steps * batch_size, held_out=False, seed=seed + 1)
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
    (out_dir / "build.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_run_settings(out_dir)
    return summary


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
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(build_base(args.out, steps=args.steps, seed=args.seed, lr=args.lr), indent=2))


if __name__ == "__main__":
    main()
