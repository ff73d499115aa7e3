"""Resumable checkpoints: written atomically with a checksum of every file, checked before a resume.

Plumbing a learner may skip (plumbing/runlog.py calls it). A checkpoint RUN_DIR/checkpoints/step_N holds

    .metadata, __R_I.distcp   model and optimizer through torch.distributed.checkpoint (DCP: each
                              rank writes its shards; any number of processes reads them back)
    trainer_state.json        counters, data position, staleness buffer, RNG states, scheduler, config
    checksums.json            the size and sha256 of every other file, written last

and RUN_DIR/checkpoints/latest names the newest. A tied tensor (the output head of SmolLM2 and of
the tiny model is their input embedding: loading.tied_names) is stored once, under its first
name, and restored under both, still one tensor (a checkpoint that stored it twice reads the
first copy). An optimizer that has taken no step yet is saved as such and restored fresh
(torch.distributed.checkpoint's get_state_dict initialises its state by a step at lr 0, which
would count as AdamW's first). Everything is written into step_N.tmp, which is renamed into
place only once complete, so a crash at any point leaves `latest` naming a complete checkpoint.
A write that fails (a full disk: DCP wraps the storage error in a CheckpointException, a
BaseException) removes the partial directory and stops the run with one line naming the disk's
free space and the checkpoint `--resume latest` continues from.

Before a resume every file is checked against checksums.json (the sha256 of a rank's share of the
files is computed by that rank, on writing and on reading), so a truncated, missing or altered
file (a same-size byte flip included) is refused with one line naming the file and the previous
complete checkpoint, before anything is loaded. A checkpoint written before checksums existed is
checked for missing and truncated files only (against what its .metadata says the shards hold).
The cost is measured in docs/scale.md "Checkpoints: a full disk, damage, checksums".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import verifier
from plumbing.cli import RunStopped
from plumbing.distributed import Dist, all_gather_objects, broadcast_object, first_failure
from plumbing.loading import tied_names
from rollout import Sample
from task import Problem

MANIFEST = "checksums.json"  # {"sha256": {file: hex}, "bytes": {file: size}}; written last
STATE = "trainer_state.json"


class CheckpointDamaged(ValueError):
    """A checkpoint's file is missing, truncated or altered; the message names it and where to resume instead."""


# --- writing ----------------------------------------------------------------------------------------


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, config: dict, dist: Dist,
                    keep: int) -> Path:
    """Atomic, resumable checkpoint after `step` completed rollout steps (module docstring); a collective.

    Model and optimizer go through torch.distributed.checkpoint; everything else is JSON. Only the
    newest `keep` checkpoints are kept.

    Raises:
        RunStopped (on every rank): the write failed (a full disk, a file-size limit, ...); the
            partial directory is removed and `latest` still names the last complete checkpoint.
    """
    root = run_dir / "checkpoints"
    final, tmp = root / f"step_{step:06d}", root / f"step_{step:06d}.tmp"
    failure = first_failure(_on_main(dist, lambda: _fresh_dir(tmp)), dist)
    if failure is None:
        fresh = not optimizer.state  # no optimizer step yet (a stop before the first step): get_state_dict makes one up
        model_sd, optim_sd = get_state_dict(model, optimizer)
        model_sd = {k: v for k, v in model_sd.items() if k not in tied_names(model)}  # a tied tensor once
        try:
            with warnings.catch_warnings():  # one process: DCP warns that it assumes a single process, which is right
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        except CheckpointException as e:  # raised on every rank: DCP gathers every rank's failure
            failure = _cause(e)
        failure = first_failure(failure, dist)
    if failure is None:  # each rank hashes its share of the files (the page cache still holds its own)
        names = broadcast_object(sorted(p.name for p in tmp.iterdir()) if dist.main else None, dist)
        shares = all_gather_objects(_digests(tmp, names[dist.rank :: dist.world]), dist)
        if fresh:  # torch's _init_optim_state took a step at lr 0 (AdamW's step count 1, zero moments): undone
            optimizer.state.clear()
        trainer = _trainer_state({**state, "optimizer_fresh": fresh}, step, config, dist, scheduler) if dist.main else None
        failure = first_failure(_on_main(dist, lambda: _publish(root, tmp, final, trainer, shares, keep)), dist)
    if failure is not None:
        if dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise RunStopped(broadcast_object(_write_failure(root, final, failure) if dist.main else None, dist))
    return final


def _fresh_dir(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)


def _trainer_state(state: dict, step: int, config: dict, dist: Dist, scheduler) -> dict:
    np_state = np.random.get_state()
    return {**state, "step": step, "config": config, "world_size": dist.world, "scheduler": scheduler.state_dict(),
            "rng": {"python": _jsonable(random.getstate()), "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
                    "torch": torch.get_rng_state().tolist()}}


def _publish(root: Path, tmp: Path, final: Path, trainer: dict, shares: list, keep: int) -> None:
    """Rank 0, once every shard is written and hashed: trainer_state.json, checksums.json, the rename, `latest`."""
    (tmp / STATE).write_text(json.dumps(trainer) + "\n")
    files = {name: d for share in shares for name, d in share.items()} | _digests(tmp, [STATE])
    (tmp / MANIFEST).write_text(json.dumps({"sha256": {n: d[0] for n, d in sorted(files.items())},
                                            "bytes": {n: d[1] for n, d in sorted(files.items())}}, indent=1) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    try:
        (root / "latest.tmp").write_text(final.name + "\n")
        os.replace(root / "latest.tmp", root / "latest")
    except OSError:
        shutil.rmtree(final, ignore_errors=True)  # complete, but `latest` could not name it: never leave it half-known
        raise
    for old in sorted(p for p in root.glob("step_*") if not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old)


def _write_failure(root: Path, final: Path, cause: str) -> str:
    """The one line of a failed write: the cause, the disk's free space, what --resume latest continues from."""
    latest = _latest(root)
    sizes = f", the last checkpoint takes {_size(_dir_bytes(latest))}" if latest else ""
    then = (f"--resume latest continues from {latest} (step {int(latest.name[5:])})" if latest else
            "no checkpoint was written before this one, so --resume latest has nothing to continue from")
    return (f"could not write checkpoint {final} ({cause}); the disk of {root} has {_size(shutil.disk_usage(root).free)} "
            f"free{sizes}. The partial checkpoint was removed and {then}: free space on that disk, then run the same "
            "command with --resume latest")


def final_failure(root: Path, final: Path, cause: str) -> str:
    """The one line of a failed write of final/ (a full disk): the checkpoint written just before holds the same weights."""
    latest = _latest(root)
    then = (f"{latest} holds the same weights: free space on that disk, then run the same command with --resume latest "
            "(it trains no further step and writes final/)") if latest else "free space on that disk and run it again"
    free = _size(shutil.disk_usage(final.parent).free)
    return f"could not write the trained model to {final} ({cause}); the disk has {free} free. {then}"


def unfinished_model(path: Path) -> str | None:
    """Why `path`, a run directory or its final/, holds no complete trained model, naming the checkpoint that holds
    the weights (eval.py's refusal); None when it holds one, or is no run's directory.

    final/dapo_run.json is written last (policy.save_hf), so a final/ without it is a write that stopped (a full
    disk: final_failure); a run directory without final/ is a run that has not finished.
    """
    path = Path(path)
    if path.name == "final" and _is_run(path.parent):
        run, final = path.parent, path
    elif _is_run(path):
        run, final = path, path / "final"
    else:
        return None
    if (final / "dapo_run.json").is_file():
        return None
    latest = _latest(run / "checkpoints")
    what = (f"{final} is incomplete: it lacks dapo_run.json, which is written last, so writing it stopped (as on a full "
            "disk)") if final.is_dir() else f"{run} holds a run without {final.name}/ (it has not finished)"
    then = (f"{latest} (step {int(latest.name[5:])}) holds the run's last weights: "
            + ("free space on that disk, then " if final.is_dir() else "") + "run the training command again with "
            "--resume latest, which trains the steps left (none if the run had finished) and writes final/"
            ) if latest else f"{run / 'checkpoints'} holds no checkpoint of its weights either"
    return f"{what}; {then}"


def _is_run(path: Path) -> bool:
    """A train.py run directory: its metrics or its checkpoints are there."""
    return (path / "metrics.jsonl").is_file() or (path / "checkpoints").is_dir()


# --- checking and reading ----------------------------------------------------------------------------


def find_checkpoint(run_dir: Path, resume: str) -> Path:
    """The checkpoint directory --resume names: 'latest' (RUN_DIR/checkpoints/latest) or a path.

    Raises FileNotFoundError naming the fix.
    """
    latest = run_dir / "checkpoints" / "latest"
    if resume == "latest" and not latest.is_file():
        raise FileNotFoundError(f"--resume latest: {run_dir} holds no checkpoint ({latest} is missing); pass the "
                                "--run_dir of the run to continue, or a checkpoint directory, or drop --resume")
    ckpt = run_dir / "checkpoints" / latest.read_text().strip() if resume == "latest" else Path(resume)
    if not ckpt.is_dir():
        raise FileNotFoundError(f"--resume {resume!r}: no checkpoint at {ckpt}")
    return ckpt


def check_checkpoint(path: Path, dist: Dist) -> None:
    """Refuse a damaged checkpoint before anything is loaded from it; a collective.

    Every file checksums.json lists must be there, at its size, with its sha256 (rank r hashes
    files r, r + world, ...); trainer_state.json must parse. A checkpoint without checksums.json
    (written before it existed) is checked for missing and truncated files only.

    Raises:
        CheckpointDamaged (on every rank): the first broken file, and the previous complete
            checkpoint to resume from instead (or that there is none).
    """
    expected, problem, hashed = (_expected(path) if dist.main else (None, None, True))
    expected, problem, hashed = broadcast_object((expected, problem, hashed), dist)
    if problem is None:
        names = sorted(expected)
        found = [_file_problem(path, n, *expected[n], hash_it=hashed) for n in names[dist.rank :: dist.world]]
        problem = next((p for share in all_gather_objects(found, dist) for p in share if p), None)
    if problem is None and dist.main and not hashed:
        print(f"[resume] {path} has no {MANIFEST} (written before checkpoints carried checksums): checked for missing "
              "and truncated files only", flush=True)
    if problem is None:
        problem = broadcast_object(_state_problem(path) if dist.main else None, dist)
    if problem is not None:
        raise CheckpointDamaged(f"checkpoint {path} is damaged: {problem}; nothing was loaded. {_instead(path)}")


def _expected(path: Path) -> tuple[dict, str | None, bool]:
    """({file: (bytes, sha256 or None)}, a problem found on the way or None, whether sizes are exact and
    hashes known). Without checksums.json: DCP's files from .metadata, each at least as long as the
    last byte .metadata places in it, and trainer_state.json."""
    manifest = path / MANIFEST
    if manifest.is_file():
        try:
            m = json.loads(manifest.read_text())
            return {n: (int(m["bytes"][n]), m["sha256"][n]) for n in m["sha256"]}, None, True
        except (ValueError, KeyError, TypeError) as e:
            return {}, f"{manifest} is not the list of checksums this code writes ({type(e).__name__}: {e})", True
    meta = path / ".metadata"
    if not meta.is_file():
        return {}, f"{meta} is missing", False
    try:
        storage = dcp.FileSystemReader(str(path)).read_metadata().storage_data
    except Exception as e:  # unpickling damaged bytes can raise nearly anything
        return {}, f"{meta} cannot be read ({type(e).__name__}: {e})", False
    ends: dict = {STATE: 1}
    for info in storage.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    return {n: (end, None) for n, end in ends.items()}, None, False


def _file_problem(path: Path, name: str, size: int, sha256: str | None, *, hash_it: bool) -> str | None:
    f = path / name
    if not f.is_file():
        return f"{f} is missing"
    have = f.stat().st_size
    if sha256 is not None and have != size:
        return f"{f} has {have} bytes, {size} were written"
    if sha256 is None and have < size:
        return f"{f} has {have} bytes, but .metadata places data up to byte {size} (truncated)"
    if hash_it and sha256 is not None and _sha256(f) != sha256:
        return f"{f} does not match its sha256 in {MANIFEST} (its bytes changed after they were written)"
    return None


def _state_problem(path: Path) -> str | None:
    try:
        json.loads((path / STATE).read_text())
    except ValueError as e:
        return f"{path / STATE} is not valid JSON ({e})"
    return None


def _instead(path: Path) -> str:
    """Where to resume instead of a damaged checkpoint: the newest earlier one whose files are all there at their sizes."""
    for other in sorted((p for p in path.parent.glob("step_*") if not p.name.endswith(".tmp") and p.name < path.name),
                        reverse=True):
        expected, problem, _ = _expected(other)
        if problem is None and not any(_file_problem(other, n, *e, hash_it=False) for n, e in expected.items()):
            return f"Resume from the previous complete checkpoint: --resume {other}"
    return f"{path.parent} holds no earlier complete checkpoint: start the run again without --resume"


# The tiny task's options when they were train.Config fields (tiny_train_size, ...), as they were then. A
# config saved with these values means TinyTask's defaults; they are TinyTask's defaults today too
# (tests/test_eval.py checks it: should those change, an old run's values must be written out instead).
_TINY_FIELDS = {"tiny_train_size": ("train_size", 20000), "tiny_heldout_size": ("heldout_size", 256),
                "tiny_heldout_seed": ("heldout_seed", 0)}


def upgrade_config(config: dict) -> dict:
    """A run's config saved before --task existed, as today's: its tiny_* fields become the tiny task's
    task_args (the ones that differ from its defaults, on a run of --data tiny). Read wherever a saved
    config is: a checkpoint's trainer_state.json (load_checkpoint), a model's dapo_run.json (eval.py)."""
    out = {k: v for k, v in config.items() if k not in _TINY_FIELDS}
    if "task_args" not in out and config.get("data", "tiny") == "tiny":
        args = {new: config[k] for k, (new, default) in _TINY_FIELDS.items() if k in config and config[k] != default}
        out["task_args"] = json.dumps(args, sort_keys=True)
    return out


def load_checkpoint(path: Path, model, optimizer, scheduler, config: dict, defaults: dict, free: set,
                    allow_change: bool, world: int = 1) -> dict:
    """Restore model, optimizer, scheduler and RNG states; return the trainer state.

    config: this run's config as a dict; defaults: the config class's defaults (a field added
    after the checkpoint was written counts as its default); free: fields that may differ.
    world: this run's number of processes. The shards of the checkpoint are resharded to it
    (torch.distributed.checkpoint reads any layout), and a run on another number of processes
    continues exactly when it generates the same prompt shards (gen_shards_of). Call
    check_checkpoint first.

    Raises:
        ValueError: the config differs from the checkpoint's (outside `free`) and not allow_change,
            or this number of processes would cut generation rounds into other shards.
        CheckpointDamaged: torch.distributed.checkpoint could not read the shards.
    """
    trainer = json.loads((path / STATE).read_text())
    saved = {**defaults, **upgrade_config(trainer["config"])}  # a checkpoint from before --task: the same run
    saved_world = trainer.get("world_size", world)  # checkpoints from before the field: assume this run's
    shards, saved_shards = gen_shards_of(config, world), gen_shards_of(saved, saved_world)
    if shards != saved_shards:
        raise ValueError(f"checkpoint {path} was written by {saved_world} processes cutting each generation round into "
                         f"{saved_shards} prompt shards; this run ({world} processes) would cut {shards}, and the rollouts would "
                         f"differ from the saved run's. Pass --gen_shards {saved_shards} (any number of processes then "
                         f"continues exactly), or resume with {saved_world} processes")
    free = free | {"gen_shards"}  # 0 and its explicit value are the same shards (checked above)
    diff = {k: (saved.get(k), v) for k, v in config.items() if k not in free and saved.get(k) != v}
    if diff and not allow_change:
        raise ValueError(f"config differs from the checkpoint {path} in {diff} (saved, now). Resume with the same "
                         "settings, or pass --resume_allow_config_change true")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    tied = tied_names(model)
    sd = {"model": {k: v for k, v in model_sd.items() if k not in tied}, "optim": optim_sd}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(sd, checkpoint_id=str(path))  # a checkpoint that stored a tied tensor twice: its first name is read
    except CheckpointException as e:
        raise CheckpointDamaged(f"checkpoint {path} cannot be read ({_cause(e)}). {_instead(path)}") from None
    sd["model"] |= {alias: sd["model"][name] for alias, name in tied.items() if name in sd["model"]}  # one tensor, two names
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    if trainer.get("optimizer_fresh"):  # saved before any optimizer step: fresh again, as the uninterrupted run's
        optimizer.state.clear()
    scheduler.load_state_dict(trainer["scheduler"])
    rng = trainer["rng"]
    random.setstate(_tuplify(rng["python"]))
    np.random.set_state((rng["numpy"][0], np.array(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    return trainer


def gen_shards_of(config: dict, world: int) -> int:
    """Prompt shards per generation round (train.collect_groups) of a run of `world` processes with the
    train.Config fields in `config` (gen_shards, vllm_tp, max_policy_lag, generator_process,
    generator_workers): --gen_shards, or 0 = one per engine group inline, one per worker with a
    generator process (whose sharding does not depend on the learners' world)."""
    if config.get("max_policy_lag", 0) > 0 or config.get("generator_process", False):
        return config["gen_shards"] or config.get("generator_workers", 1)
    return config["gen_shards"] or world // config["vllm_tp"]


# --- small helpers ---------------------------------------------------------------------------------------


def _on_main(dist: Dist, fn) -> str | None:
    """fn() on rank 0; None, or the OSError it raised as text (other ranks: None)."""
    if not dist.main:
        return None
    try:
        fn()
    except OSError as e:
        return str(e)
    return None


def _cause(e: CheckpointException) -> str:
    """The first storage error behind a CheckpointException: an OSError ("[Errno 28] No space left on device")
    when one is in an exception's chain (torch.save reports a short write as a RuntimeError), else the first error."""
    first = None
    for wrapped in e.failures.values():
        exc = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        first = first or exc
        seen = set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            if isinstance(exc, OSError):
                return str(exc)
            exc = exc.__cause__ or exc.__context__
    return f"{type(first).__name__}: {first}".splitlines()[0] if first is not None else "CheckpointException"


def _digests(d: Path, names: list[str]) -> dict[str, tuple[str, int]]:
    return {n: (_sha256(d / n), (d / n).stat().st_size) for n in names}


def _sha256(f: Path) -> str:
    with open(f, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _latest(root: Path) -> Path | None:
    name = (root / "latest").read_text().strip() if (root / "latest").is_file() else ""
    return root / name if name and (root / name).is_dir() else None


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


# --- the staleness buffer (--max_rollout_age): kept groups waiting for a later step ------------------------


def buffer_state(groups: list) -> list[dict]:
    """train.Group objects as JSON, for a checkpoint's trainer_state.json."""
    out = []
    for g in groups:
        d = {f.name: getattr(g, f.name) for f in dataclasses.fields(g)}
        out.append({**d, "problem": dataclasses.asdict(g.problem), "samples": [dataclasses.asdict(x) for x in g.samples],
                    "scores": [dataclasses.asdict(x) for x in g.scores],
                    **{k: d[k].tolist() for k in ("reward_overlong", "reward", "correct")}})
    return out


def buffer_of(states: list[dict], group_cls) -> list:
    """The groups `buffer_state` wrote, as group_cls (train.Group) objects again."""
    return [group_cls(**{**d, "problem": Problem(**d["problem"]), "samples": [Sample(**x) for x in d["samples"]],
                         "scores": [verifier.Score(**x) for x in d["scores"]],
                         **{k: torch.tensor(d[k]) for k in ("reward_overlong", "reward", "correct")}}) for d in states]
