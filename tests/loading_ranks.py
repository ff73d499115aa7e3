"""One rank of tests/test_loading.py's torchrun job: load tiny checkpoints sharded, check them, write rank<r>.json.

    torchrun --nproc_per_node=W tests/loading_ranks.py MODELS_DIR OUT_DIR

Every check runs in this one job per world size (a torchrun start and the transformers import
cost ~5 s per rank); test_loading.py asserts on the JSON. MODELS_DIR holds the directories that
test_loading.build_models writes. Also defines the architecture with a persistent buffer that the
test registers with transformers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM


class MarkerConfig(Qwen2Config):
    model_type = "qwen2-marker"


class MarkerForCausalLM(Qwen2ForCausalLM):
    """Qwen2 with a persistent buffer (saved in the checkpoint; a rebuild from the config would zero it)."""

    config_class = MarkerConfig

    def __init__(self, config):
        super().__init__(config)
        self.model.register_buffer("marker", torch.zeros(5), persistent=True)


def register() -> None:
    AutoConfig.register(MarkerConfig.model_type, MarkerConfig, exist_ok=True)
    AutoModelForCausalLM.register(MarkerConfig, MarkerForCausalLM, exist_ok=True)


def main(models: Path, out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch.distributed as tdist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    from plumbing import loading
    from plumbing import distributed
    from plumbing import policy

    register()
    dist, device = distributed.init_distributed("cpu")
    torch.set_num_threads(1)
    local = lambda t: (t.to_local() if isinstance(t, DTensor) else t).detach()  # noqa: E731
    res: dict = {"world": dist.world}

    def reference(name: str):
        return AutoModelForCausalLM.from_pretrained(models / name, dtype=torch.float32)  # one whole process's model

    def load(name: str):
        torch.use_deterministic_algorithms(True)  # with the next line: torch.empty (so to_empty) fills floats with NaN
        torch.utils.deterministic.fill_uninitialized_memory = True
        try:
            return policy.load_model(str(models / name), device, world=dist.world)
        finally:
            torch.use_deterministic_algorithms(False)

    # the tripwire trips: to_empty without the rebuild leaves the rotary table NaN
    with torch.device("meta"):
        bare = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(models / "tied"), dtype=torch.float32)
    torch.use_deterministic_algorithms(True)
    bare.to_empty(device="cpu")
    torch.use_deterministic_algorithms(False)
    res["tripwire_nan_without_rebuild"] = bool(torch.isnan(bare.model.rotary_emb.inv_freq).all())

    ids = torch.randint(0, 1000, (2, 80), generator=torch.Generator().manual_seed(0))  # (2, 80): longer than 64
    for name in ("tied", "rope", "marker"):
        model, ref = load(name), reference(name)
        r = res[name] = {}
        r["finite"] = all(bool(torch.isfinite(local(t)).all()) for t in [*model.parameters(), *model.buffers()])
        r["training_mode"] = model.training
        rot, rot_ref = model.model.rotary_emb, ref.model.rotary_emb
        r["rotary_equal"] = (torch.equal(rot.inv_freq, rot_ref.inv_freq) and torch.equal(rot.original_inv_freq,
                             rot_ref.original_inv_freq) and rot.attention_scaling == rot_ref.attention_scaling)
        r["rotary_dtype"] = str(rot.inv_freq.dtype)
        r["attention_scaling"] = rot.attention_scaling
        r["tied"] = model.lm_head.weight is model.model.embed_tokens.weight
        r["generation_config_equal"] = model.generation_config.to_dict() == ref.generation_config.to_dict()
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        ours = loading.gather_on_rank0(model, dist.rank, dist.world)
        if dist.main:
            want = ref.state_dict()
            r["keys_equal"] = set(full) == set(want)
            r["state_bit_equal"] = all(torch.equal(full[k], want[k]) for k in want)
            r["gather_on_rank0_equal"] = set(ours) == set(full) - set(loading.tied_names(model)) and all(
                torch.equal(ours[k], full[k]) for k in ours)
        else:
            r["gather_on_rank0_none"] = ours is None
        if name == "marker":
            r["marker"] = model.model.marker.tolist()
        with torch.no_grad():
            r["logits_max_diff"] = float((model(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max())
        if name == "tied":  # one AdamW step on the same batch everywhere (FSDP averages equal gradients)
            model.reshard()  # the root group (embeddings) stays gathered after a forward without backward
            before = local(model.model.embed_tokens.weight).clone()
            for m in (model, ref):
                m.train()
                opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
                logits = m(input_ids=ids).logits  # (2, 80, V)
                torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
                opt.step()
            r["tied_after_step"] = model.lm_head.weight is model.model.embed_tokens.weight
            rows = local(model.model.embed_tokens.weight)
            r["local_rows"] = rows.shape[0]
            r["local_rows_unchanged"] = int((rows == before).all(dim=1).sum())  # every row gets the head's gradient
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if dist.main:
                r["after_step_max_diff"] = max(float((full[k] - v).abs().max()) for k, v in ref.state_dict().items())
        tdist.barrier()

    for name in ("tie_equal", "alias_only"):  # both tied names stored (equal), or only lm_head.weight
        model, ref = load(name), reference(name)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        res[name] = {"tied": model.lm_head.weight is model.model.embed_tokens.weight}
        if dist.main:
            res[name]["state_bit_equal"] = all(torch.equal(full[k], v) for k, v in ref.state_dict().items())

    for name in ("missing", "unexpected", "misshapen", "tie_differs", "bin_only", "unknown_arch", "stray"):
        try:
            load(name)
            res[f"error/{name}"] = None
        except (OSError, ValueError) as e:
            res[f"error/{name}"] = f"{type(e).__name__}: {e}"
    (out / f"rank{dist.rank}.json").write_text(json.dumps(res))
    distributed.close_distributed(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
