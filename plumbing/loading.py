"""Hugging Face checkpoints in and out: checks, loading straight into FSDP2 shards, gathering for saving.

Plumbing a learner may skip (policy.load_model and policy.save_hf are the entry points). With
one process the model comes from transformers' `from_pretrained`, as it always did; this file
checks the directory and the checkpoint's tensors around it. Under torchrun a 32B model in
float32 (131 GB) cannot be built whole on every rank before FSDP2 shards it, so every rank instead

  1. builds the model from its config.json on the meta device (shapes, no memory), float32
     whatever dtype the file stores: the master weights are fp32;
  2. shards it (the caller's `shard`: policy.wrap_fsdp, `fully_shard` on every decoder layer,
     then the root);
  3. materialises only its own shards (`to_empty`: uninitialised memory), and checks that tied
     input and output embeddings are still one tensor (an untied copy would train apart,
     verl-project/verl PR 7835);
  4. rebuilds the buffers no checkpoint holds (non-persistent: the rotary embedding's
     `inv_freq`), as the owning module's own __init__ computes them, in float32, before reading
     the weights (reading first would let the rebuild overwrite buffers the checkpoint does hold:
     PrimeIntellect-ai/prime-rl PR 3333);
  5. reads only its slices of the safetensors files (torch.distributed.checkpoint with its
     HuggingFaceStorageReader: each rank opens the files and copies the rows of its shards,
     bf16 in the file becoming fp32 in the shard).

This is the pattern of torchtitan (torchtitan/trainer.py, initial_load_in_hf) and prime-rl
(src/prime_rl/trainer/model.py, load_dcp_from_hf). The traps each step guards against, every one
a test in tests/test_loading.py: `to_empty` memory read as a rotary table (pytorch/torchtitan PR
3772, huggingface/transformers#45902: loss at ln V, positions silently lost); buffers cast to
bf16 with the weights (NovaSky-AI/SkyRL PR 1725); tied embeddings silently untied, the embedding
then getting only half its gradient (verl-project/verl PR 7835), or sharded unevenly in two FSDP
groups (pytorch/pytorch#176076: keep them in the root group); a checkpoint whose tensors do
not match the model, which `from_pretrained` only warns about and fills with random values
(huggingface/accelerate#3870).
Saving final/ goes the other way: the shards are gathered to rank 0 alone (gather_on_rank0).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
import transformers
from safetensors import safe_open
from torch.distributed.tensor import DTensor, Shard
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

WEIGHTS_INDEX = "model.safetensors.index.json"


# --- the directory and its tensors ----------------------------------------------------------------


def model_config(path: str, *, trust_remote_code: bool = False):
    """The transformers config of an HF model directory whose weights are safetensors.

    Raises:
        FileNotFoundError: no config.json, or no .safetensors file (a directory with only
            pickled .bin/.pt weights is refused: loading a pickle can run code).
        ValueError: config.json names an architecture this transformers does not know.
    """
    d = Path(path)
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"--model {path}: no config.json; pass a Hugging Face model directory (config.json + "
                                "*.safetensors)")
    if not weight_files(d):
        pickled = sorted(p.name for p in d.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        what = f"only pickled weights ({', '.join(pickled[:3])})" if pickled else "no weights"
        raise FileNotFoundError(f"--model {path}: {what} and no .safetensors file; weights load from safetensors only "
                                "(a pickle can run code): convert them once with transformers, "
                                "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR)")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as e:  # an unknown model_type: transformers' message spans a paragraph
        kind = json.loads((d / "config.json").read_text()).get("model_type")
        raise ValueError(f"--model {path}: config.json names model_type {kind!r}, which transformers "
                         f"{transformers.__version__} does not know ({type(e).__name__}); install a transformers that "
                         "does, or pass --trust_remote_code true if the directory ships its own model code") from None


def meta_model(path: str, *, trust_remote_code: bool = False):
    """The causal LM of a directory's config.json on the meta device (shapes only, no memory), float32.

    Raises FileNotFoundError / ValueError as model_config, or ValueError for a config of a model
    that is not a causal LM.
    """
    config = model_config(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
        except ValueError as e:  # a known architecture that is not a causal LM (e.g. an encoder)
            raise ValueError(f"--model {path}: {type(config).__name__} has no causal-LM class in transformers ({e}); "
                             "pass a causal language model") from None


def weight_files(d: Path) -> list[Path]:
    """The safetensors files holding a model's weights: those the index names, else every *.safetensors."""
    if (d / WEIGHTS_INDEX).is_file():
        return sorted({d / f for f in json.loads((d / WEIGHTS_INDEX).read_text())["weight_map"].values()})
    return sorted(d.glob("*.safetensors"))


def check_weight_files(path: str | Path) -> None:
    """Every safetensors file of a model directory is there and exactly as long as its header says.

    A truncated file (an interrupted copy, download or save) otherwise fails deep inside the
    loader with a SafetensorError that names no file; a missing shard (named in the index) with a
    bare FileNotFoundError. Reads only each file's header. (A same-size alteration passes: a model
    directory carries no checksums; a resumable checkpoint does, plumbing/checkpoints.py.)

    Raises:
        FileNotFoundError / ValueError: the first missing or damaged file, named, with the fix.
    """
    fix = ("copy or save it again (a run's final/: run the run's command again with --resume latest, which writes "
           "final/ from its last checkpoint without training a step)")
    for f in weight_files(Path(path)):
        if not f.is_file():
            raise FileNotFoundError(f"weights file {f} is missing ({WEIGHTS_INDEX} names it): {fix}")
        size, end = f.stat().st_size, None
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            try:
                header = json.loads(fh.read(n)) if 8 + n <= size else None
                end = 8 + n + max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
            except (ValueError, TypeError, KeyError, AttributeError, IndexError):  # bytes that are not a header
                pass
        if end != size:
            what = f"its header describes {end}" if end else "its header cannot be read"
            raise ValueError(f"weights file {f} is damaged: it has {size} bytes, {what} (truncated?): {fix}")


def checkpoint_tensors(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (file name, shape)} of a directory's safetensors files, from their headers only
    (check_weight_files first)."""
    check_weight_files(path)
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in weight_files(Path(path)):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if key in out:
                    raise ValueError(f"--model {path}: tensor {key!r} is in both {out[key][0]} and {f.name}")
                out[key] = (f.name, tuple(st.get_slice(key).get_shape()))
    return out


def tied_names(model) -> dict[str, str]:
    """{alias: name} for parameters registered under two names (tied embeddings: lm_head.weight -> model.embed_tokens.weight)."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


def check_tensors(model, path: str, found: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """Every tensor the model keeps in its state dict is in the checkpoint, with its shape, and nothing else is.

    A tied alias (tied_names) may be absent, or present in place of the tensor it aliases. Tensors
    transformers itself ignores are allowed: old checkpoints' `rotary_emb.inv_freq`, and the
    model class's `_keys_to_ignore_on_load_unexpected`. found: checkpoint_tensors(path).

    Raises:
        ValueError: the first missing, unexpected or misshapen tensor, named with its file.
    """
    arch = type(model).__name__.removeprefix("FSDP")
    tied = tied_names(model)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in tied}
    files = ", ".join(sorted({f for f, _ in found.values()})) or "(no file)"
    for key, shape in expected.items():
        source = key if key in found else next((a for a, n in tied.items() if n == key and a in found), None)
        if source is None:
            raise ValueError(f"--model {path}: the checkpoint has no tensor {key!r}, which {arch} needs (files: {files}); the "
                             "directory is incomplete or holds another model")
        if found[source][1] != shape:
            raise ValueError(f"--model {path}: {found[source][0]} holds {source!r} of shape {list(found[source][1])}, but "
                             f"{arch} of this config.json needs {list(shape)}")
    ignore = [r"rotary_emb\.inv_freq", *(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])]
    for key, (file, _) in found.items():
        if key not in expected and key not in tied and not any(re.search(p, key) for p in ignore):
            raise ValueError(f"--model {path}: {file} holds {key!r}, which {arch} of this config.json does not have; the "
                             "checkpoint is of another architecture or configuration")


def tie_error(path: str, alias: str, name: str) -> ValueError:
    """The error (returned, not raised) for a checkpoint whose tied tensors `alias` and `name` differ."""
    return ValueError(f"--model {path}: config.json ties {alias!r} to {name!r} (tie_word_embeddings), but the checkpoint "
                      "holds both with different values; set \"tie_word_embeddings\": false in config.json to train two "
                      "matrices, or remove the one not wanted")


# --- one process: transformers' from_pretrained ------------------------------------------------------


def load_whole(path: str, device: torch.device, *, trust_remote_code: bool = False):
    """The causal LM of an HF directory in float32 on `device`, by `from_pretrained`, with this file's checks.

    Raises FileNotFoundError / ValueError as model_config and check_tensors, or for tied
    embeddings stored twice with different values (which from_pretrained unties with a warning).
    """
    check_tensors(meta_model(path, trust_remote_code=trust_remote_code), path, checkpoint_tensors(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True,
                                                 trust_remote_code=trust_remote_code).to(device)
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if getattr(model.config, "tie_word_embeddings", False) and out_emb is not None and out_emb.weight is not in_emb.weight:
        raise tie_error(path, "lm_head.weight", "model.embed_tokens.weight")
    return model


# --- under torchrun: straight into FSDP2 shards -------------------------------------------------------


def load_sharded(path: str, device: torch.device, shard, *, trust_remote_code: bool = False, offload: bool = False):
    """The causal LM of an HF directory as FSDP2 shards, each rank reading only its slices (steps 1-5 above).

    A collective: every rank of the default process group calls it. shard: a function that
    applies FSDP2 to the meta-device model in place (policy.wrap_fsdp). offload: the shards
    live in CPU memory (FSDP2 CPUOffloadPolicy), buffers on `device`. Returns the model in eval
    mode, as `from_pretrained` does, with the directory's generation_config.json when it has one.

    Raises FileNotFoundError / ValueError as model_config and check_tensors, or when a
    non-persistent buffer cannot be rebuilt (rebuild_buffers), or for a tie the values break.
    """
    model = meta_model(path, trust_remote_code=trust_remote_code)
    stray = sorted(set(Path(path).glob("*.safetensors")) - set(weight_files(Path(path))))
    if stray:  # HuggingFaceStorageReader reads every .safetensors file of the directory, listed or not
        raise ValueError(f"--model {path}: {stray[0].name} is not in {WEIGHTS_INDEX}, and the sharded loader would read it "
                         "too; move it out of the directory")
    found = checkpoint_tensors(path)
    check_tensors(model, path, found)  # before any memory is spent
    shard(model)
    tied = tied_names(model)
    model.to_empty(device="cpu" if offload else device)
    if tied_names(model) != tied:  # FSDP2 in torch 2.13 keeps a shared parameter shared through to_empty
        raise RuntimeError(f"to_empty untied {sorted(tied)} of {type(model).__name__}: this torch's FSDP2 does not keep "
                           "tied parameters tied; the output head would train apart from the embedding")
    rebuild_buffers(model, device)
    state = {k: v for k, v in model.state_dict().items() if k not in tied}  # views of this rank's shards
    compare = {}
    for alias, name in tied.items():
        if alias in found and name in found:  # both stored: read the alias aside, it must equal the tensor it aliases
            compare[alias] = state[alias] = torch.empty_like(state[name])
        elif alias in found:  # only the alias is stored (some checkpoints keep lm_head.weight): it fills the tensor
            state[alias] = state.pop(name)
    dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(path))  # in place, into the shards
    for alias, scratch in compare.items():
        mine = state[tied[alias]]
        same = torch.tensor([int(torch.equal(scratch.to_local(), mine.to_local()))])
        tdist.all_reduce(same, op=tdist.ReduceOp.MIN)
        if not same.item():
            raise tie_error(path, alias, tied[alias])
    if (Path(path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.eval()


def rebuild_buffers(model, device: torch.device) -> None:
    """Rebuild every non-persistent buffer (in no checkpoint) after `to_empty`, and put all buffers on `device`.

    Each owning module is built again from its config on the CPU in float32 and put in place of
    the meta-built one: its buffers and plain attributes (the rotary embedding's inv_freq,
    original_inv_freq, attention_scaling, for any rope_scaling type) are then what its __init__
    computes, which is what `from_pretrained` gives. Buffers are not cast: FSDP2 mixed precision
    casts parameters only, and the rotary table stays float32 (NovaSky-AI/SkyRL PR 1725).

    Raises:
        ValueError: a non-persistent buffer whose module has parameters or no config: it cannot be
            rebuilt this way (use one process, or add its rule here).
    """
    persistent = set(model.state_dict())
    owners = sorted({n.rpartition(".")[0] for n, _ in model.named_buffers() if n not in persistent})
    for owner_name in owners:
        owner = model.get_submodule(owner_name)
        if next(owner.parameters(), None) is not None or not hasattr(owner, "config"):
            raise ValueError(f"{type(owner).__name__} ({owner_name or 'the model'}) keeps a non-persistent buffer that the "
                             "sharded loader cannot rebuild (its module has parameters or no config); run with one process")
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            with torch.device("cpu"):
                fresh = type(owner)(owner.config)
        finally:
            torch.set_default_dtype(default)
        parent, _, attr = owner_name.rpartition(".")
        setattr(model.get_submodule(parent), attr, fresh.to(device))
    for m in model.modules():  # persistent buffers: to_empty put them where the shards live
        for n, b in m._buffers.items():
            if b is not None and b.device != device:
                m._buffers[n] = b.to(device)


def gather_on_rank0(model, rank: int, world: int) -> dict[str, torch.Tensor] | None:
    """The whole state dict, on CPU, on rank 0 only (None on the other ranks); a collective.

    One tensor at a time, each FSDP2 shard sent to rank 0 with `gather` (not all-gather, as
    torch's get_model_state_dict does): the other ranks never hold more than their own shard,
    rank 0 the state dict plus one tensor in flight. Tied aliases are left out (save_pretrained
    writes a tied tensor once).

    Raises:
        ValueError: a parameter FSDP2 did not shard on dimension 0 (wrap_fsdp always does).
    """
    tied = tied_names(model)
    out = {} if rank == 0 else None
    for name, t in model.state_dict().items():
        if name in tied:
            continue
        if not isinstance(t, DTensor):  # buffers: the same on every rank
            if out is not None:
                out[name] = t.detach().cpu()
            continue
        if tuple(t.placements) != (Shard(0),):
            raise ValueError(f"{name} is sharded as {t.placements}, not on dimension 0; gather it with get_model_state_dict")
        rows = -(-t.shape[0] // world)  # FSDP2 shards like torch.chunk: ceil(d0 / world) rows, the last ranks fewer
        local = t.to_local().detach()
        send = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device_mesh.device_type)  # (rows, ...)
        send[: local.shape[0]] = local
        parts = [torch.empty_like(send) for _ in range(world)] if rank == 0 else None
        tdist.gather(send, parts, dst=0)
        if out is not None:
            out[name] = torch.cat(parts)[: t.shape[0]].cpu()  # (d0, ...)
    return out
