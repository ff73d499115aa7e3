"""Loading checkpoints: the sharded loader under torchrun (2 and 3 gloo ranks) against one process's from_pretrained.

Each trap of the sharded path (plumbing/loading.py) is a check: the gathered state dict bit for bit, logits
on 80 positions (a wrong rotary table still "works" on short inputs), no uninitialised memory left
(to_empty fills NaN here), the rotary table rebuilt in float32 also with yarn rope scaling, tied
embeddings one tensor that trains like one process's also with a vocabulary (1001) no world size
divides, persistent buffers keeping the checkpoint's values, and checkpoints that must be refused.
The checkpoints are tiny Qwen2 models saved in bf16 (the master weights must still be fp32). One
torchrun job per world size runs every check (tests/loading_ranks.py) and the tests read its JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import train
from plumbing import cli, policy
from conftest import cpu_ranks_env
from loading_ranks import MarkerConfig, register

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "assets" / "tiny-base"
ERRORS = {  # checkpoint -> what the one-line error must say
    "missing": "has no tensor 'model.layers.1.mlp.up_proj.weight'",
    "unexpected": "model.safetensors holds 'model.layers.0.mlp.extra.weight'",
    "misshapen": "holds 'model.norm.weight' of shape [65]",
    "tie_differs": "holds both with different values",
    "bin_only": "only pickled weights (pytorch_model.bin)",
    "unknown_arch": "model_type 'not-a-model'",
}
SHARDED_ERRORS = {  # the sharded loader only: from_pretrained reads the files the index lists
    "stray": "consolidated.safetensors is not in model.safetensors.index.json",
}

pytestmark = pytest.mark.engine  # transformers: from_pretrained, model classes on the meta device


def _qwen2(tie: bool, cls=None, **extra):
    from transformers import Qwen2Config

    return (cls or Qwen2Config)(vocab_size=1001, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tie, eos_token_id=1,
                       pad_token_id=0, bos_token_id=None, **extra)


def _save(model, out: Path) -> None:
    """`model` saved as bf16 safetensors, with the tiny tokenizer beside it."""
    model.to(torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / f, out / f)


def _variant(src: Path, out: Path, edit) -> None:
    shutil.copytree(src, out)
    sd = edit(load_file(src / "model.safetensors"))
    if sd is not None:
        save_file(sd, out / "model.safetensors", metadata={"format": "pt"})


def build_models(root: Path) -> Path:
    """The checkpoints loading_ranks.py loads, under root."""
    from transformers import AutoModelForCausalLM

    from loading_ranks import MarkerForCausalLM

    register()
    torch.manual_seed(0)
    tied = root / "tied"
    _save(AutoModelForCausalLM.from_config(_qwen2(True)), tied)
    _save(AutoModelForCausalLM.from_config(_qwen2(False, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64})), root / "rope")
    marker = MarkerForCausalLM(_qwen2(True, MarkerConfig))
    marker.model.marker.copy_(torch.arange(1.0, 6.0))
    _save(marker, root / "marker")
    emb = "model.embed_tokens.weight"
    _variant(tied, root / "tie_equal", lambda sd: {**sd, "lm_head.weight": sd[emb].clone()})
    _variant(tied, root / "alias_only", lambda sd: {("lm_head.weight" if k == emb else k): v for k, v in sd.items()})
    _variant(tied, root / "tie_differs", lambda sd: {**sd, "lm_head.weight": sd[emb] * 2})
    _variant(tied, root / "missing", lambda sd: {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"})
    _variant(tied, root / "unexpected", lambda sd: {**sd, "model.layers.0.mlp.extra.weight": torch.zeros(3)})
    _variant(tied, root / "misshapen", lambda sd: {**sd, "model.norm.weight": torch.ones(65, dtype=torch.bfloat16)})

    def to_bin(sd):
        torch.save(sd, root / "bin_only" / "pytorch_model.bin")
        (root / "bin_only" / "model.safetensors").unlink()

    _variant(tied, root / "bin_only", to_bin)
    _variant(tied, root / "stray", lambda sd: None)  # a second copy of the weights beside an index that omits it
    shutil.copy(tied / "model.safetensors", root / "stray" / "consolidated.safetensors")
    keys = load_file(tied / "model.safetensors")
    (root / "stray" / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model.safetensors" for k in keys}}))
    _variant(tied, root / "unknown_arch", lambda sd: None)
    cfg = json.loads((root / "unknown_arch" / "config.json").read_text())
    (root / "unknown_arch" / "config.json").write_text(json.dumps({**cfg, "model_type": "not-a-model"}))
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return build_models(tmp_path_factory.mktemp("ckpts"))


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def ranks(request, models, tmp_path_factory) -> list[dict]:
    """Every rank's rank<r>.json of one torchrun job of loading_ranks.py."""
    if sys.platform != "linux":
        pytest.skip("gloo torchrun tests run on Linux")
    out = tmp_path_factory.mktemp(f"world{request.param}")
    env = cpu_ranks_env(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={request.param}", "--standalone",
                          str(REPO / "tests" / "loading_ranks.py"), str(models), str(out)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(request.param)]


def test_gathered_weights_and_long_logits_equal_one_process(ranks):
    for name in ("tied", "rope", "marker"):
        main = ranks[0][name]
        assert main["keys_equal"] and main["state_bit_equal"], name  # bf16 file -> fp32 master weights, bit for bit
        assert main["gather_on_rank0_equal"] and all(r[name]["gather_on_rank0_none"] for r in ranks[1:])
        assert all(r[name]["logits_max_diff"] <= 1e-6 for r in ranks), name  # 80 positions
        assert all(r[name]["generation_config_equal"] and not r[name]["training_mode"] for r in ranks)


def test_no_uninitialised_memory_and_rotary_rebuilt_in_fp32(ranks):
    assert all(r["tripwire_nan_without_rebuild"] for r in ranks)  # the NaN fill is on: skipping the rebuild would show
    for name in ("tied", "rope", "marker"):
        assert all(r[name]["finite"] and r[name]["rotary_equal"] and r[name]["rotary_dtype"] == "torch.float32"
                   for r in ranks), name
    assert all(r["rope"]["attention_scaling"] > 1.0 for r in ranks)  # yarn: the rebuilt module kept its scaling


def test_tied_embeddings_stay_one_tensor_and_train_like_one_process(ranks):
    assert 1001 % ranks[0]["world"] != 0  # uneven shards of the tied matrix
    for r in ranks:
        assert r["tied"]["tied"] and r["tied"]["tied_after_step"] and r["marker"]["tied"] and not r["rope"]["tied"]
        assert r["tied"]["local_rows_unchanged"] == 0 and r["tied"]["local_rows"] > 0  # every rank's rows moved
    assert sum(r["tied"]["local_rows"] for r in ranks) == 1001
    assert ranks[0]["tied"]["after_step_max_diff"] <= 1e-5  # the AdamW step of one process (fp32 reduction order)
    for name in ("tie_equal", "alias_only"):
        assert all(r[name]["tied"] for r in ranks) and ranks[0][name]["state_bit_equal"], name


def test_persistent_buffer_keeps_the_checkpoint_values(ranks):
    assert all(r["marker"]["marker"] == [1.0, 2.0, 3.0, 4.0, 5.0] for r in ranks)


def test_bad_checkpoints_are_refused_on_every_rank(ranks):
    for name, says in {**ERRORS, **SHARDED_ERRORS}.items():
        for r in ranks:
            assert r[f"error/{name}"] is not None and says in r[f"error/{name}"], (name, r[f"error/{name}"])


# --- one process: from_pretrained with the same checks --------------------------------------------------


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_one_process_refuses_the_same_checkpoints(models, name):
    with pytest.raises((OSError, ValueError), match=None) as e:
        policy.load_model(str(models / name), torch.device("cpu"))
    assert ERRORS[name] in str(e.value)


def test_one_process_loads_tied_variants(models):
    ref = policy.load_model(str(models / "tied"), torch.device("cpu"))
    for name in ("tie_equal", "alias_only"):
        model = policy.load_model(str(models / name), torch.device("cpu"))
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert torch.equal(model.model.embed_tokens.weight, ref.model.embed_tokens.weight)


@pytest.mark.parametrize("name", ["bin_only", "unknown_arch"])
def test_train_py_says_one_line_and_exits_2(models, name, capsys):
    status = cli.run_cli(train.main, ["--model", str(models / name), "--steps", "0", "--eval_data=", "--task_args",
                                      '{"train_size": 64}', "--run_dir", str(models / f"run-{name}")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("error: --model ") and ERRORS[name] in err[0], err
