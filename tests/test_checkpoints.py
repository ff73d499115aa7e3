"""A full disk and damaged files, on the real entry points (plumbing/checkpoints.py, plumbing/loading.py).

Faults provoked at their bad moment, each ending in one `error:` line and exit status 2:
1. The disk fills while a checkpoint is written (torch.distributed.checkpoint wraps the storage
   error in a CheckpointException, a BaseException): ENOSPC raised by the checkpoint's own
   writer in-process, and a real process over its file-size limit (RLIMIT_FSIZE, so the kernel
   refuses the write). The line names the directory, the free space and the checkpoint
   `--resume latest` continues from; the partial directory is gone; `latest` still names a
   complete checkpoint, from which the run continues.
2. The disk fills while final/ is written: the checkpoint just written holds the weights, and
   `--resume latest` writes final/ again without training a step.
3. A damaged checkpoint is refused before anything is loaded or trained, naming the broken file
   and the previous complete checkpoint: a truncated, missing or altered (same size) shard, a
   missing .metadata, a truncated trainer_state.json, a damaged checksums.json, and the same
   without checksums (a checkpoint written before they existed). Resuming from the named one works.
4. A truncated or missing final/model.safetensors given to eval.py names the file; a final/ cut
   short before its dapo_run.json (written last), or a run without final/, is named as such with
   the checkpoint that holds the weights.
5. A tied tensor (the tiny model's output head is its input embedding, as SmolLM2's) is stored
   once in a checkpoint and restored tied; a checkpoint that stored it twice still loads, tied.

Run: OMP_NUM_THREADS=1 python -m pytest -q tests/test_checkpoints.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import resource
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.filesystem as dcp_fs

import eval as ev
import train
from plumbing import checkpoints, cli, policy
from plumbing.distributed import Dist

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--eval_data", "", "--probe_every", "0", "--group_size", "4", "--prompts_per_step", "4",
         "--gen_prompts_per_round", "6", "--mini_batch_size", "8", "--run_id", "t",
         "--task_args", '{"train_size": 200}']
STEP1, STEP2 = "step_000001", "step_000002"


def _run(argv: list[str], capsys, runner=train.main) -> tuple[int, list[str]]:
    """(exit status, stderr lines starting with `error:` or holding a traceback) of an entry point run as its command runs it."""
    capsys.readouterr()
    code = cli.run_cli(runner, argv)
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.startswith("error:") or "Traceback" in line]


def _metrics_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory) -> Path:
    """A run of 2 steps with a checkpoint after each (step_000001, step_000002 = latest) and final/."""
    run = tmp_path_factory.mktemp("ckpt") / "run"
    train.main(["--run_dir", str(run), "--steps", "2", "--save_every", "1", *SMALL])
    return run


@pytest.fixture
def run_copy(two_checkpoints, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    return run


@contextlib.contextmanager
def _disk_with(budget: int):
    """torch.distributed.checkpoint's writes fail with ENOSPC once `budget` bytes have been written (a disk filling up)."""
    real, left = dcp_fs.FileSystem.create_stream, [budget]

    class Full:
        def __init__(self, stream):
            self.stream = stream

        def write(self, b) -> int:
            n = len(memoryview(b).cast("B"))
            if n > left[0]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            left[0] -= n
            return self.stream.write(b)

        def __getattr__(self, name):
            return getattr(self.stream, name)

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with real(self, path, mode) as stream:
            yield Full(stream) if "w" in mode else stream

    dcp_fs.FileSystem.create_stream = create_stream
    try:
        yield
    finally:
        dcp_fs.FileSystem.create_stream = real


def test_a_full_disk_during_a_checkpoint_is_one_line_and_loses_nothing(run_copy, capsys):
    with _disk_with(1_000_000):  # step 3's checkpoint (15 MB) fails in its shard
        code, lines = _run(["--run_dir", str(run_copy), "--steps", "4", "--save_every", "1", "--resume", "latest", *SMALL],
                           capsys)
    root = run_copy / "checkpoints"
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: could not write checkpoint {root / 'step_000003'} ([Errno 28] No space left on device); "
                               f"the disk of {root} has "), lines[0]
    assert " free, the last checkpoint takes 14." in lines[0] and " MiB." in lines[0]
    assert f"The partial checkpoint was removed and --resume latest continues from {root / STEP2} (step 2)" in lines[0]
    assert sorted(p.name for p in root.iterdir()) == ["latest", STEP1, STEP2]  # no step_000003(.tmp)
    assert (root / "latest").read_text().strip() == STEP2
    assert _metrics_steps(run_copy) == [0, 1, 2]  # step 2 was trained and logged; the checkpoint after it failed
    # latest is intact: the run continues from it
    code, lines = _run(["--run_dir", str(run_copy), "--steps", "4", "--save_every", "1", "--resume", "latest", *SMALL],
                       capsys)
    assert code == 0 and not lines and _metrics_steps(run_copy) == [0, 1, 2, 3]


def _limited(limit: int):
    def preexec() -> None:  # the child cannot write a file past `limit` bytes (EFBIG); Python ignores SIGXFSZ
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file-size limit of a child process (RLIMIT_FSIZE)")
def test_a_real_write_refused_by_the_kernel_ends_in_one_line(run_copy):
    """The kernel refuses the shard's bytes past 2 MB in a real process: the same one line, exit status 2, no traceback."""
    out = subprocess.run([sys.executable, "train.py", "--run_dir", str(run_copy), "--steps", "3", "--resume", "latest",
                          *SMALL], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600, preexec_fn=_limited(2_000_000))
    root = run_copy / "checkpoints"
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(errors) == 1, out.stderr[-3000:]
    assert errors[0].startswith(f"error: could not write checkpoint {root / 'step_000003'} ([Errno 27] File too large)")
    assert f"--resume latest continues from {root / STEP2} (step 2)" in errors[0]
    assert sorted(p.name for p in root.iterdir()) == ["latest", STEP1, STEP2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file-size limit of a child process (RLIMIT_FSIZE)")
def test_a_full_disk_while_writing_final_names_the_checkpoint_that_writes_it_again(run_copy):
    """final/model.safetensors (4.9 MB) refused past 2 MB: the checkpoint holds the weights, and --resume latest with
    the same --steps trains nothing and writes final/ (the weights equal the checkpoint's)."""
    shutil.rmtree(run_copy / "final")
    cmd = [sys.executable, "train.py", "--run_dir", str(run_copy), "--steps", "2", "--resume", "latest", *SMALL]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, preexec_fn=_limited(2_000_000))
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(errors) == 1, out.stderr[-3000:]
    assert errors[0].startswith(f"error: could not write the trained model to {run_copy / 'final'} (")
    assert "File too large" in errors[0] and f"{run_copy / 'checkpoints' / STEP2} holds the same weights" in errors[0]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _metrics_steps(run_copy) == [0, 1]
    assert (run_copy / "final" / "model.safetensors").stat().st_size == 4943000


def _truncate(f: Path, keep: float = 0.5) -> None:
    os.truncate(f, int(f.stat().st_size * keep))


def _flip(f: Path) -> None:
    with open(f, "r+b") as fh:
        fh.seek(f.stat().st_size // 2)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 1]))


def _old(damage):
    """A checkpoint written before checksums existed (no checksums.json), then damaged."""
    def apply(d: Path) -> None:
        (d / "checksums.json").unlink()
        damage(d)
    return apply


DAMAGE = {  # name: (damage of step_000002, the broken file, what the line says about it)
    "truncated-shard": (lambda d: _truncate(d / "__0_0.distcp"), "__0_0.distcp", r"has \d+ bytes, 15074721 were written"),
    "missing-shard": (lambda d: (d / "__0_0.distcp").unlink(), "__0_0.distcp", "is missing"),
    "flipped-byte": (lambda d: _flip(d / "__0_0.distcp"), "__0_0.distcp", "does not match its sha256 in checksums.json"),
    "missing-metadata": (lambda d: (d / ".metadata").unlink(), ".metadata", "is missing"),
    "truncated-trainer-state": (lambda d: _truncate(d / "trainer_state.json"), "trainer_state.json", r"has \d+ bytes, \d+ were"),
    "damaged-checksums": (lambda d: _truncate(d / "checksums.json"), "checksums.json", "is not the list of checksums"),
    "old-truncated-shard": (_old(lambda d: _truncate(d / "__0_0.distcp")), "__0_0.distcp",
                            r"has \d+ bytes, but .metadata places data up to byte 15074721 \(truncated\)"),
    "old-missing-metadata": (_old(lambda d: (d / ".metadata").unlink()), ".metadata", "is missing"),
    "old-truncated-trainer-state": (_old(lambda d: _truncate(d / "trainer_state.json")), "trainer_state.json",
                                    "is not valid JSON"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_previous_one(run_copy, capsys, kind):
    import re

    damage, name, what = DAMAGE[kind]
    root = run_copy / "checkpoints"
    damage(root / STEP2)
    code, lines = _run(["--run_dir", str(run_copy), "--steps", "3", "--resume", "latest", *SMALL], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert re.fullmatch(rf"error: checkpoint {re.escape(str(root / STEP2))} is damaged: {re.escape(str(root / STEP2 / name))} "
                        rf"{what}.*; nothing was loaded\. Resume from the previous complete checkpoint: --resume "
                        rf"{re.escape(str(root / STEP1))}", lines[0]), lines[0]
    assert _metrics_steps(run_copy) == [0, 1] and not (root / "step_000003").exists()  # nothing trained
    if kind == "flipped-byte":  # the named checkpoint resumes: step 1 again, then step 2
        code, lines = _run(["--run_dir", str(run_copy), "--steps", "3", "--resume", str(root / STEP1), *SMALL], capsys)
        assert code == 0 and not lines and _metrics_steps(run_copy) == [0, 1, 2]


def test_a_checkpoint_from_before_the_task_flag_resumes(run_copy, capsys):
    """A checkpoint written before --task (and before checksums): its config carried the tiny task's options as
    tiny_* fields and had no task or task_args. checkpoints.upgrade_config reads it as today's run, which resumes."""
    ckpt = run_copy / "checkpoints" / STEP2
    state = json.loads((ckpt / "trainer_state.json").read_text())
    cfg = {k: v for k, v in state["config"].items() if k not in ("task", "task_args")}
    state["config"] = {**cfg, "tiny_train_size": 200, "tiny_heldout_size": 256, "tiny_heldout_seed": 0}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    (ckpt / "checksums.json").unlink()
    code, lines = _run(["--run_dir", str(run_copy), "--steps", "3", "--resume", "latest", *SMALL], capsys)
    assert code == 0 and not lines, lines
    assert _metrics_steps(run_copy) == [0, 1, 2]


def test_without_an_earlier_complete_checkpoint_the_line_says_start_again(run_copy, capsys):
    root = run_copy / "checkpoints"
    _truncate(root / STEP1 / "__0_0.distcp")
    _flip(root / STEP2 / "__0_0.distcp")
    code, lines = _run(["--run_dir", str(run_copy), "--steps", "3", "--resume", "latest", *SMALL], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].endswith(f"nothing was loaded. {root} holds no earlier complete checkpoint: start the run again "
                             "without --resume"), lines[0]


@pytest.mark.parametrize("kind", ["truncated", "missing"])
def test_a_damaged_final_model_given_to_eval_names_the_file(run_copy, capsys, kind):
    weights = run_copy / "final" / "model.safetensors"
    if kind == "truncated":
        _truncate(weights, 0.6)
    else:  # a sharded model whose index names a file that is not there
        index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}
        (run_copy / "final" / "model.safetensors.index.json").write_text(json.dumps(index))
    code, lines = _run(["--model", str(run_copy), "--data", "tiny", "--k", "1", "--limit", "2"], capsys, ev.main)
    assert code == 2 and len(lines) == 1, lines
    if kind == "truncated":
        assert lines[0].startswith(f"error: weights file {weights} is damaged: it has 2965800 bytes, its header describes "
                                   "4943000 (truncated?)"), lines[0]
    else:
        assert lines[0].startswith(f"error: weights file {run_copy / 'final' / 'model-00002-of-00002.safetensors'} is "
                                   "missing"), lines[0]
    assert "--resume latest, which writes final/ from its last checkpoint" in lines[0]


@pytest.mark.parametrize("how", ["cut-short", "not-written"])
def test_a_final_model_cut_short_or_missing_is_named_with_the_checkpoint_that_holds_the_weights(run_copy, capsys, how):
    final = run_copy / "final"
    if how == "cut-short":  # a full disk while final/ was written: its weights half there, dapo_run.json (last) never
        (final / "dapo_run.json").unlink()
        _truncate(final / "model.safetensors", 0.4)
        what = (f"{final} is incomplete: it lacks dapo_run.json, which is written last, so writing it stopped (as on a "
                "full disk)")
    else:
        shutil.rmtree(final)
        what = f"{run_copy} holds a run without final/ (it has not finished)"
    then = (f"{run_copy / 'checkpoints' / STEP2} (step 2) holds the run's last weights: "
            + ("free space on that disk, then " if how == "cut-short" else "") + "run the training command again with "
            "--resume latest, which trains the steps left (none if the run had finished) and writes final/")
    for spec in (run_copy, final):
        code, lines = _run(["--model", str(spec), "--data", "tiny", "--k", "1", "--limit", "2"], capsys, ev.main)
        assert code == 2 and lines == [f"error: --model {spec}: {what}; {then}"], lines


def _fresh_model_and_optimizer():
    model, _ = policy.load_policy("", torch.device("cpu"))
    optimizer, scheduler = policy.make_optimizer(model, train.Config())
    return model, optimizer, scheduler


def _load(ckpt):
    model, optimizer, scheduler = _fresh_model_and_optimizer()
    config = json.loads((ckpt / "trainer_state.json").read_text())["config"]
    checkpoints.load_checkpoint(ckpt, model, optimizer, scheduler, config, dataclasses.asdict(train.Config()),
                                train.RESUME_FREE_FIELDS, False)
    return model


def test_a_tied_embedding_is_stored_once_and_restored_tied(two_checkpoints, tmp_path, monkeypatch):
    ckpt = two_checkpoints / "checkpoints" / STEP2
    stored = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    assert "model.model.embed_tokens.weight" in stored and "model.lm_head.weight" not in stored
    model = _load(ckpt)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # one tensor, as before the checkpoint
    sd = {"model.embed_tokens.weight": torch.empty_like(model.model.embed_tokens.weight)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": sd}, checkpoint_id=str(ckpt))
    assert torch.equal(model.lm_head.weight, sd["model.embed_tokens.weight"])
    # a checkpoint that stored it twice (before this mend) still loads, tied, from its first copy
    monkeypatch.setattr(checkpoints, "tied_names", lambda m: {})
    old_model, optimizer, scheduler = _fresh_model_and_optimizer()
    old = checkpoints.save_checkpoint(tmp_path / "old", 1, old_model, optimizer, scheduler, {},
                                      dataclasses.asdict(train.Config()), Dist(), keep=1)
    assert "model.lm_head.weight" in dcp.FileSystemReader(str(old)).read_metadata().state_dict_metadata
    monkeypatch.undo()
    model = _load(old)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, old_model.lm_head.weight)


_RANKS_SCRIPT = """
import json, sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import train
from plumbing import checkpoints, distributed, policy
torch.set_num_threads(1)
cfg = train.Config(bf16=False)
dist, device = distributed.init_distributed("cpu")
model = policy.load_model("", device, world=dist.world, fsdp=cfg)  # FSDP2 shards on 2 ranks
optimizer, scheduler = policy.make_optimizer(model, cfg)
run = Path(sys.argv[2]) / "run"
ckpt = checkpoints.save_checkpoint(run, 1, model, optimizer, scheduler, {}, {}, dist, keep=2)
checkpoints.check_checkpoint(ckpt, dist)  # sound: every rank checks its share and agrees
manifest = json.loads((ckpt / "checksums.json").read_text())
if dist.main:  # alter the shard file the last rank checks (files r, r + world, ...)
    name = sorted(manifest["sha256"])[dist.world - 1]
    with open(ckpt / name, "r+b") as f:
        f.seek(manifest["bytes"][name] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))
distributed.barrier(dist)
try:
    checkpoints.check_checkpoint(ckpt, dist)
    verdict = "accepted"
except checkpoints.CheckpointDamaged as e:
    verdict = f"refused: {sorted(manifest['sha256'])} {e}"
# one file per rank, not stdout: two ranks' prints share torchrun's pipe and can interleave mid-line
# (seen in CI: "...--resumeRANK 1 refused: ...", one line where two were written)
(Path(sys.argv[2]) / f"rank{dist.rank}.txt").write_text(verdict)
distributed.close_distributed(dist)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="torchrun with gloo needs a POSIX system")
def test_two_ranks_write_hash_and_check_their_shares_and_refuse_together(tmp_path, one_and_two_ranks):
    """Under torchrun every rank hashes and checks its share of the files: a byte altered in the file only the
    last rank checks is refused on every rank with the same line (no rank left waiting in a collective)."""
    one_and_two_ranks(_RANKS_SCRIPT, tmp_path)
    for world, ranks in (("one", 1), ("two", 2)):
        verdicts = [(tmp_path / world / f"rank{r}.txt").read_text() for r in range(ranks)]
        assert all(v.startswith("refused: ") and "does not match its sha256 in checksums.json" in v
                   for v in verdicts), verdicts
        assert len(set(verdicts)) == 1  # the same line on every rank
    two = (tmp_path / "two" / "rank0.txt").read_text()
    assert "__1_0.distcp" in two and "__0_0.distcp" in two  # two ranks wrote two shard files
