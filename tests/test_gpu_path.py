"""The GPU path's decisions, checked on the CPU: slow-reference and stand-in tests of what only a GPU runs.

Nothing here needs a GPU or vLLM. Each test takes one decision of the CUDA path out of the code that
cannot run here (vLLM's placement under torchrun, the weight-sync check's rule, the order an engine
wakes in, the 1-rank FSDP2 mesh, the fp32 output head, the NCCL wait, the threads of an offloaded
optimizer) and checks it with fakes or stand-ins, plus the CPU dry run of the whole GPU check
(bench/gpu_check.sh --cpu). docs/scale.md "The GPU check" says what only a GPU shows.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rollout
from plumbing import distributed, forward, policy, transport, vllm_engine
from rollout import WeightSyncError
from tasks import tiny

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--steps", "2", "--eval_data=", "--probe_every", "0", "--group_size", "4", "--prompts_per_step", "2",
         "--gen_prompts_per_round", "2", "--mini_batch_size", "8", "--micro_batch_size", "8"]


# --- vLLM's placement under torchrun, and each generator worker's device ---------------------------------


def test_vllm_takes_the_external_launcher_whenever_the_trainer_owns_the_process_group():
    ext = {"distributed_executor_backend": "external_launcher"}
    for tp, world in ((1, 1), (1, 2), (1, 8), (2, 2), (2, 4), (8, 8)):  # torchrun, in-process: any tp
        assert vllm_engine.launch_kwargs(tp, True, world, True) == {**ext, "tensor_parallel_size": tp}
    assert vllm_engine.launch_kwargs(1, False, 1, True) == {}  # one process without a group: vLLM's own executor
    assert vllm_engine.launch_kwargs(1, True, 2, False) == {}  # an engine core in its own process
    for tp, owns, world, inproc in ((2, True, 3, True), (2, False, 1, True), (2, True, 2, False)):
        with pytest.raises(ValueError, match="--vllm_tp 2 needs torchrun"):
            vllm_engine.launch_kwargs(tp, owns, world, inproc)


def test_a_generator_worker_sees_only_its_own_gpu_as_device_0():
    env = distributed.worker_env(torch.device("cuda", 3), 1, 2, None)
    assert env["CUDA_VISIBLE_DEVICES"] == env[distributed.WORKER_GPU_ENV] == "3"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("1", "0", "2")  # what vLLM's launchers read
    assert distributed.worker_env(torch.device("cuda", 1), 0, 1, "4,5,6")["CUDA_VISIBLE_DEVICES"] == "5"  # the learner's 1
    assert distributed.worker_env(torch.device("cpu"), 0, 1, None) == {}


def test_a_worker_that_owns_its_gpu_gives_vllm_what_is_free_there(monkeypatch):
    """--vllm_gpu_memory_utilization 0 (the default): 0.3 of the GPU for an engine beside the trainer, and for a
    generator worker's engine, alone on its GPU beside the worker's model copy, what is free there less 0.05."""
    import train

    gib = 2**30
    free = lambda n: (lambda device: (n * gib, 140 * gib))  # noqa: E731  torch.cuda.mem_get_info of a 140 GiB GPU
    share, cuda = policy.vllm_gpu_share, torch.device("cuda", 0)
    assert train.Config().vllm_gpu_memory_utilization == 0
    assert share(0, True, cuda) == share(0, False, torch.device("cpu")) == policy.COLOCATED_VLLM_SHARE == 0.3
    assert (share(0, False, cuda, free(133)), share(0, False, cuda, free(70)), share(0, False, cuda, free(3))) == (0.9, 0.45, 0.05)
    assert share(0.5, False, cuda, free(133)) == share(0.5, True, cuda) == 0.5  # the flag, when set, wins
    got = []  # policy.make_engine, as a generator worker calls it, hands the worker's share to the engine
    monkeypatch.setattr(torch.cuda, "mem_get_info", free(120))
    engine = types.SimpleNamespace(shares_module=True)
    monkeypatch.setattr(policy, "build_engine", lambda *a, **k: got.append(k["gpu_memory_utilization"]) or engine)
    model = types.SimpleNamespace()
    for colocated in (False, True):
        policy.make_engine(train.Config(), model, None, cuda, 1, 8, announce=False, colocated=colocated)
    assert got == [round(120 / 140 - 0.05, 2), 0.3]


def test_one_process_on_cuda_becomes_a_torchrun_job_of_one():
    env = distributed.single_process_env()
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == dict.fromkeys(
        ("RANK", "LOCAL_RANK"), "0") | dict.fromkeys(("WORLD_SIZE", "LOCAL_WORLD_SIZE"), "1")
    assert 0 < int(env["MASTER_PORT"]) < 65536
    assert distributed.Dist(0, 1, True).sharded and distributed.Dist(0, 2).sharded and not distributed.Dist().sharded


# --- the weight-sync check: the sync, not the numerics ---------------------------------------------------


def test_the_sync_rule_stops_only_on_evidence_of_a_failed_sync():
    fail = rollout.sync_failure
    assert fail(0.05, 1.3, 0.04, 0.1) is None  # a bf16 pair's gap in its own noise band
    assert fail(0.12, 1.3, 0.04, 0.1) is None  # 3x the pair's gap on identical weights: still numerics
    assert "kept the previous weights" in fail(1.3, 1.3, 0.04, 0.1)  # skipped: the update's gap unchanged
    assert "exceeds" in fail(0.6, 1.3, 0.04, 0.1) and "kept" not in fail(0.6, 1.3, 0.04, 0.1)  # partial
    assert fail(float("nan"), 1.0, 0.04, 0.1) and fail(float("inf"), None, None, 0.1)
    assert fail(2e-5, None, None, 1e-4) is None and fail(2e-4, None, None, 1e-4)  # fp32: the floor alone


class CopyEngine(rollout.Engine):
    """A stand-in for vLLM: weights of its own (a copy of the trainer's model in `dtype`), loaded from the
    weight stream (except names containing one of `skip`: a partial sync), scored by the trainer's pass."""

    name = "copy"

    def __init__(self, model, dtype=torch.bfloat16, skip=()):
        super().__init__()
        self.model, self.dtype, self.skip = copy.deepcopy(model).to(dtype), str(dtype).removeprefix("torch."), skip
        self.sync_atol = 0.05  # vllm_engine's bf16 floor

    def sync_weights(self, pairs, policy_version: int) -> float:
        own = self.model.state_dict()
        with torch.no_grad():
            for k, v in pairs:
                if not any(s in k for s in self.skip):
                    own[k].copy_(v)
        self.policy_version = policy_version
        return 0.0

    def probe_logprobs(self, prompt_ids, response_ids) -> torch.Tensor:
        return forward.sequence_logprobs(self.model, prompt_ids, response_ids).double()


def _update(model, seed: int, scale: float = 0.2) -> None:
    """An update of every weight by `scale` of its mean size: a sync that misses it moves the probe by nats."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * float(p.abs().mean()))


@pytest.mark.parametrize("failure", ["skipped", "partial"])
def test_an_in_sync_bf16_engine_passes_beside_an_fp32_trainer_and_a_broken_sync_stops(failure):
    """A bf16 stand-in engine beside the fp32 trainer: the pair's own gap on identical weights is measured at
    version 0, an in-sync engine passes after large updates (whose max gap exceeds a fixed 4x-noise bar on
    its max: the mean is the stable statistic), a sync that loads nothing or misses two of three layers stops."""
    model = policy.load_model("", torch.device("cpu"))
    forward.attach(model)
    tok = policy.load_tokenizer("")
    prompt, answer = (tok(t, add_special_tokens=False)["input_ids"] for t in ("What is 23+58?\nAnswer:", " 81"))
    engine = CopyEngine(model, skip=("layers.1.", "layers.2.") if failure == "partial" else ())
    engine.sync_probe = rollout.sync_probe(prompt, answer, 128)
    assert len(engine.sync_probe[1]) == min(rollout.SYNC_PROBE_TOKENS, len(prompt) + len(answer) - 1)
    engine.probe_seen = engine.probe_logprobs(*engine.sync_probe)  # policy.make_engine: both on the checkpoint
    first = rollout.sync_engine(engine, model, 0)
    assert 1e-4 < engine.sync_noise < 0.05  # bf16 against fp32 on identical weights: numerics, measured
    assert first["sync/logprob_gap_mean"] <= first["sync/logprob_gap_bar"] == 0.05
    _update(model, 1)
    if failure == "partial":  # layers 1 and 2 never reach the engine
        with pytest.raises(WeightSyncError, match="exceeds"):
            rollout.sync_engine(engine, model, 1)
        return
    out = rollout.sync_engine(engine, model, 1)  # an in-sync bf16 engine: passes
    assert out["sync/logprob_gap_before"] > 10 * out["sync/logprob_gap_mean"]
    _update(model, 2)
    engine.sync_weights = lambda pairs, v: list(pairs) and 0.0  # the stream consumed, nothing loaded: a skipped sync
    with pytest.raises(WeightSyncError, match="kept the previous weights"):
        rollout.sync_engine(engine, model, 2)


# --- the wake order of a colocated engine ------------------------------------------------------------------


class FakeLLM:
    def __init__(self, calls):
        self.calls = calls

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake {tags}")

    def collective_rpc(self, method, kwargs):
        list(kwargs["weights_iterator"])  # the stream, consumed as vLLM's reload does
        self.calls.append(method)

    def reset_prefix_cache(self):
        return True


def test_a_sleeping_engine_wakes_its_weights_then_syncs_then_wakes_its_kv_cache(monkeypatch):
    calls = []
    engine = vllm_engine.VLLMEngine.__new__(vllm_engine.VLLMEngine)
    rollout.Engine.__init__(engine)
    engine.llm, engine._asleep, engine._can_sleep, engine.sync_via, engine.dtype = FakeLLM(calls), set(), True, "iterator", "bfloat16"
    monkeypatch.setattr(vllm_engine, "release_cached_memory", lambda: calls.append("release"))
    engine.sleep()
    rollout.sync_engine(engine, policy.load_model("", torch.device("cpu")), 1)
    assert calls == ["sleep 2", "release", "wake ['weights']", "reload_weights", "release", "wake ['kv_cache']"]
    assert vllm_engine.wake_order(set(), None) == [] and vllm_engine.wake_order({"kv_cache"}, ("weights",)) == []


class SleepyEngine:
    """A colocated vLLM engine as the run's end sees it: sleeps, closes, and its GPU peak from before vLLM's reset."""

    peak_before_start = {"gpu": 7.5, "gpu_reserved": 8.0}

    def __init__(self, calls: list):
        self.calls = calls

    def sleep(self) -> None:
        self.calls.append("sleep")

    def close(self) -> None:
        self.calls.append("close")


def test_final_is_gathered_with_the_engine_asleep(tmp_path, monkeypatch):
    """runlog.Run.finish: the engine sleeps before rank 0 gathers the whole model into final/ (a colocated vLLM
    awake after the held-out evaluation would hold its share of the GPU beside the gathered model)."""
    import train
    from plumbing import runlog

    calls = []
    monkeypatch.setattr(runlog, "save_hf", lambda *a, **k: calls.append("save final/"))
    run = runlog.Run.__new__(runlog.Run)  # the fields finish reads, without a run around them
    run.cfg, run.dist, run.device = train.Config(run_dir=str(tmp_path)), distributed.Dist(), torch.device("cpu")
    run.engine, run.run_id, run.t_run, run.prov = SleepyEngine(calls), "r", 0.0, {"template_hash": ""}
    run.signal, run.after_load = types.SimpleNamespace(restore=lambda: None), runlog.memory_gib(run.device)
    run.log, run.prompts_cut = types.SimpleNamespace(scalars=lambda *a: None, close=lambda: None), {}
    run.finish(None, None, {}, {})
    assert calls == ["sleep", "save final/", "close"]


def test_the_load_peak_keeps_what_came_before_vllms_reset_of_it(monkeypatch):
    """memory/gpu_load_gib: vLLM's memory profiling resets torch's GPU peak at start-up, so the load figure is the
    larger of the peak since then and the one the engine recorded before it started (the model's load)."""
    from plumbing import runlog

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2 * 2**30)  # since vLLM's reset
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 9 * 2**30)
    cuda = torch.device("cuda")
    assert runlog.load_memory(cuda, SleepyEngine([])) | {"host": 0} == {"host": 0, "gpu": 7.5, "gpu_reserved": 9.0}
    assert runlog.load_memory(cuda, rollout.Engine()) | {"host": 0} == {"host": 0, "gpu": 2.0, "gpu_reserved": 9.0}


# --- one process on CUDA: FSDP2 over a 1-rank mesh, the same run -------------------------------------------


def test_the_one_rank_fsdp2_path_trains_as_the_plain_process(tmp_path):
    """train.py with $DAPO_ONE_RANK_MESH=1 takes, on the CPU, the path one GPU takes (a 1-rank process group,
    the sharded loader, FSDP2, DCP checkpoints, final/ gathered): the same weights as the plain process."""
    finals = {}
    for name, extra in (("plain", {}), ("mesh", {distributed.ONE_RANK_MESH_ENV: "1"})):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        out = subprocess.run([sys.executable, "train.py", *SMALL, "--run_dir", str(tmp_path / name)], cwd=REPO,
                             env={**env, "OMP_NUM_THREADS": "1", **extra}, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        finals[name] = load_file(str(tmp_path / name / "final" / "model.safetensors"))
    ckpt = next((tmp_path / "mesh" / "checkpoints").glob("step_*"))
    assert any(ckpt.glob("*.distcp"))  # sharded (DCP) checkpoint of the FSDP2 model
    assert finals["plain"].keys() == finals["mesh"].keys()
    worst = max(float((finals["plain"][k] - finals["mesh"][k]).abs().max()) for k in finals["plain"])
    assert worst < 1e-5, worst


# --- the fp32 output head ------------------------------------------------------------------------------------


def test_the_head_product_of_bf16_weights_is_taken_in_fp32():
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(64, 96, generator=g) * 2).bfloat16()  # (N, D)
    w = (torch.randn(3000, 96, generator=g) * 0.5).bfloat16()  # (V, D)
    tok = torch.randint(0, 3000, (64,), generator=g)  # (N,)
    ref = torch.log_softmax(h.double() @ w.double().t(), -1).gather(1, tok[:, None]).squeeze(1)  # float64 of the same values
    fp32, _ = forward.token_logprobs(h, w, tok, chunk_size=16)
    rounded, _ = forward.token_logprobs(h, w, tok, chunk_size=16, fp32_head=False)
    assert float((fp32.double() - ref).abs().max()) < 1e-5
    assert float((rounded.double() - ref).abs().max()) > 1e-3  # the bf16-rounded product it replaces


def test_generation_logits_follow_the_trainers_head_precision():
    model = policy.load_model("", torch.device("cpu"))
    forward.attach(model)
    model.to(torch.bfloat16)  # as under FSDP2 mixed precision
    x = torch.randn(2, 5, model.config.hidden_size).bfloat16()  # (B, S, D)
    head = model.get_output_embeddings()
    with torch.no_grad():
        ref = x.double() @ head.weight.double().t()  # (B, S, V) the exact products of the bf16 values
        assert head(x).dtype == torch.float32 and float((head(x).double() - ref).abs().max()) < 1e-5
        forward.set_fp32_head(model, False)  # an engine whose head cannot be fp32: neither side is
        assert head(x).dtype == torch.bfloat16


class _OnCuda(torch.Tensor):
    """A meta tensor that says it is on CUDA: fp32_product's CUDA branch, run on the CPU (the meta device has
    torch.mm(out_dtype) and autograd's bookkeeping, and no kernels)."""

    @property
    def is_cuda(self) -> bool:
        return True


def _on_cuda(*shape: int, grad: bool) -> torch.Tensor:
    return torch.Tensor._make_subclass(_OnCuda, torch.empty(*shape, device="meta", dtype=torch.bfloat16), grad)


def test_the_fp32_head_product_of_cuda_bf16_weights_has_a_gradient(monkeypatch):
    """A loss through the model's own logits (the GPU check's naive reference, a fork's warm-up) runs backward
    through fp32_product: torch.mm(out_dtype) has no derivative ("derivative for aten::mm is not implemented"),
    so with a gradient the operands upcast; without one (the trainer's chunked head) it stays one fp32-output GEMM."""
    h, w = _on_cuda(8, 16, grad=True), _on_cuda(32, 16, grad=True)  # (N, D) hidden states, (V, D) head weight
    z = forward.fp32_product(h, w)  # (N, V)
    assert z.dtype == torch.float32
    z.sum().backward()
    assert h.grad.shape == h.shape and w.grad.shape == w.shape and w.grad.dtype == torch.bfloat16
    real, seen = torch.mm, []
    monkeypatch.setattr(torch, "mm", lambda *a, **k: seen.append(k.get("out_dtype")) or real(*a, **k))
    with torch.no_grad():
        assert forward.fp32_product(h, w).dtype == torch.float32
    assert seen == [torch.float32]


def _stand_in_vllm(monkeypatch, applies_head_dtype: bool) -> None:
    """vllm, vllm.envs, vllm.config and vllm.platforms as a GPU build would present them to VLLMEngine: an LLM whose
    ModelConfig has `head_dtype`; applies_head_dtype False is a vLLM before PR 48390, where the property answers
    the model dtype for a generation model whatever hf_overrides says."""
    class ModelConfig:
        def __init__(self, dtype: str, overrides: dict | None):
            self.dtype, self.overrides = getattr(torch, dtype), overrides or {}

        @property
        def head_dtype(self):
            asked = self.overrides.get("head_dtype") == "float32"
            return torch.float32 if asked and applies_head_dtype else self.dtype

    class LLM:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            config = ModelConfig(kwargs["dtype"], kwargs.get("hf_overrides"))
            self.llm_engine = types.SimpleNamespace(model_config=config)

    mods = {name: types.ModuleType(name) for name in ("vllm", "vllm.envs", "vllm.config", "vllm.platforms")}
    mods["vllm"].__version__, mods["vllm"].LLM, mods["vllm"].envs = "stand-in", LLM, mods["vllm.envs"]
    mods["vllm.envs"].VLLM_ENABLE_V1_MULTIPROCESSING = False
    mods["vllm.config"].ModelConfig = ModelConfig
    mods["vllm.platforms"].current_platform = types.SimpleNamespace(is_cpu=lambda: False)  # a GPU build
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(vllm_engine, "_vllm_env_defaults", lambda: False)


def test_the_engine_claims_an_fp32_head_only_where_the_started_vllm_computes_one(monkeypatch, capsys):
    """A bf16 engine asks for head_dtype float32; whether it got it is read from the started engine's config, so on
    a vLLM that has the property but ignores it for generation the trainer's head turns bf16 too (both or neither)."""
    tok = policy.load_tokenizer("")
    for applies in (True, False):
        _stand_in_vllm(monkeypatch, applies)
        eng = vllm_engine.VLLMEngine(tiny.ASSET_DIR, tok, seed=0, max_model_len=64, dtype="bfloat16")
        assert eng.llm.kwargs["hf_overrides"] == {"head_dtype": "float32"} and eng.fp32_head is applies
    assert "not float32: the trainer's head follows" in capsys.readouterr().err
    eng = vllm_engine.VLLMEngine(tiny.ASSET_DIR, tok, seed=0, max_model_len=64, dtype="float32")
    assert not eng.fp32_head and "hf_overrides" not in eng.llm.kwargs  # an fp32 engine: nothing to ask for
    assert not vllm_engine.head_is_fp32(types.SimpleNamespace(dtype=torch.bfloat16))  # a vLLM without the property


# --- the suite on a machine with one GPU ------------------------------------------------------------------------


def test_a_test_cannot_start_torchrun_ranks_that_see_a_gpu():
    """tests/conftest.py: a torchrun job of a test hides CUDA (cpu_ranks_env) or passes --device cpu, else the
    test fails at once, GPU or not; every test file that launches torchrun builds its environment so."""
    from conftest import cpu_ranks_env, starts_torchrun_with_cuda

    job = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "train.py"]
    visible = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    assert starts_torchrun_with_cuda(job, visible) and starts_torchrun_with_cuda("torchrun --nproc_per_node 2 x.py", visible)
    assert not starts_torchrun_with_cuda(job, cpu_ranks_env())
    assert not starts_torchrun_with_cuda([*job, "--device", "cpu"], visible)
    assert not starts_torchrun_with_cuda([sys.executable, "train.py"], visible)
    with pytest.raises(AssertionError, match="cpu_ranks_env"):
        subprocess.run([*job, "--help"], env=visible, capture_output=True)
    launching = [p.name for p in (REPO / "tests").glob("*.py") if "torch.distributed.run" in p.read_text()]
    assert len(launching) >= 6 and all("cpu_ranks_env" in (REPO / "tests" / n).read_text() for n in launching)


# --- NCCL's wait, the offloaded optimizer's threads, clocks --------------------------------------------------


class Work:
    def __init__(self, done_after: int):
        self.polls, self.done_after = 0, done_after

    def is_completed(self) -> bool:
        self.polls += 1
        return self.polls > self.done_after


def test_waiting_for_an_nccl_broadcast_has_a_deadline_and_sees_a_dead_peer():
    transport.wait_for(Work(3), 5.0, lambda: None, "a broadcast")  # completes
    with pytest.raises(transport.PeerGone, match="did not finish within 0.05 s"):
        transport.wait_for(Work(10**9), 0.05, lambda: None, "a broadcast")
    with pytest.raises(transport.PeerGone, match="worker 1 exited"):
        transport.wait_for(Work(10**9), 60.0, lambda: "worker 1 exited", "a broadcast")


class EndedWork(Work):
    """A broadcast's work that NCCL's watchdog finished with an error (TORCH_NCCL_ASYNC_ERROR_HANDLING=2)."""

    def __init__(self, error: str | None, done_after: int = 0):
        super().__init__(done_after)
        self.error = error

    def exception(self):
        return None if self.error is None else RuntimeError(self.error)


class NcclStandIn:
    """torch.distributed.ProcessGroupNCCL as BroadcastWeights builds and uses it: records the timeout and the error
    handling it was made with; `work` is what every broadcast returns."""

    class Options:
        pass

    def __init__(self, store, rank: int, size: int, opts):
        self.made = (opts._timeout, os.environ.get(transport.NCCL_ERRORS))
        self.work, self.aborted = None, False

    def broadcast(self, t, root: int):
        return self.work

    def abort(self) -> None:
        self.aborted = True


def test_the_nccl_weight_group_outlasts_the_poll_and_its_watchdog_does_not_kill_the_learner(monkeypatch):
    """The poll's deadline, not NCCL's watchdog, ends a stalled weight broadcast (the group's own timeout is longer),
    and the group is made with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (clean up, do not kill the process; torchrun sets 1
    for its ranks), restored after; an error the watchdog saw first reaches the learner as PeerGone."""
    import datetime

    import torch.distributed as tdist

    monkeypatch.setattr(tdist, "ProcessGroupNCCL", NcclStandIn, raising=False)
    monkeypatch.setenv(transport.NCCL_ERRORS, "1")
    spec = {"layout": [], "probe_len": 1, "members": 2}
    weights = transport.BroadcastWeights(spec, tdist.HashStore(), 0, torch.device("cuda"), 30.0)
    group = weights._group()
    timeout, handling = group.made
    assert timeout >= 2 * weights.timeout and handling == "2" and os.environ[transport.NCCL_ERRORS] == "1"
    group.work = EndedWork(None, done_after=2)
    weights._bcast(torch.zeros(1), 3)  # finished: no error
    group.work = EndedWork("NCCL error: remote process exited or there was a network error")
    with pytest.raises(transport.PeerGone, match="version 3 failed .NCCL error: remote process exited"):
        weights._bcast(torch.zeros(1), 3)
    weights.timeout, group.work = datetime.timedelta(seconds=0.05), EndedWork(None, done_after=10**9)
    with pytest.raises(transport.PeerGone, match="did not finish within 0.05 s"):
        weights._bcast(torch.zeros(1), 4)
    assert group.aborted


def test_an_offloaded_optimizer_gets_the_hosts_cores_and_clocks_need_no_gpu(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        distributed.seed_everything(0, 0, offload=True)
        assert torch.get_num_threads() == max(1, os.cpu_count() or 1)
        distributed.seed_everything(0, 1, offload=True)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert distributed.clock() <= distributed.clock()


# --- the GPU check's dry run ----------------------------------------------------------------------------------


def test_the_gpu_check_runs_every_step_on_the_cpu(tmp_path):
    """bash bench/gpu_check.sh --cpu: every step at tiny sizes, exit 0, two small files where $OUT points."""
    ret, work = tmp_path / "out", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu"], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**env, "OUT": str(ret), "GC_WORK": str(work), "PYTHON": sys.executable})
    assert out.returncode == 0, out.stdout[-3000:] + (work / "gpu_check.log").read_text()[-3000:]
    assert sorted(p.name for p in ret.iterdir()) == ["gpu_check.json", "gpu_check.log"]
    assert sum(p.stat().st_size for p in ret.iterdir()) < 200_000

    def strict(word):
        raise AssertionError(f"gpu_check.json holds {word}, which strict JSON readers refuse")

    summary = json.loads((ret / "gpu_check.json").read_text(), parse_constant=strict)
    status = {s["step"]: s["status"] for s in summary["steps"]}
    assert summary["ok"] and {k for k, v in status.items() if v == "ok"} >= {"env", "head", "fsdp_tiny", "build", "fsdp_big",
                                                                              "train"}
    res = {s["step"]: s["result"] for s in summary["steps"]}
    assert all(isinstance(res[k], dict) for k, v in status.items() if v == "ok"), res  # each step that ran: figures
    assert res["fsdp_tiny"]["load_bit_equal_to_from_pretrained"] and res["fsdp_tiny"]["checkpoint"]["round_trip_equal"]
    assert set(res["fsdp_tiny"]["train_step"]) == {"shared", "padded", "packed"}
    assert res["head"]["ok"] and res["head"]["chunked_peak_gib"] is None  # no CUDA peak on the CPU: null, not NaN
    assert res["build"]["parameters"] > 0 and res["train"]["steps"] == 1 and res["train"]["time/step"] > 0
    assert "heldout_after/avg@1" in res["train"]["summary"] and "sync/logprob_gap_mean" in res["train"]
    if status.get("vllm_train") == "ok":  # with vLLM installed: the figure the sync rule checks
        assert res["vllm_train"]["sync/logprob_gap_mean"] <= res["vllm_train"]["sync/logprob_gap_bar"]


def test_the_gpu_check_runs_test_vllm_py_by_names_that_exist():
    """gpu_check.sh runs tests/test_vllm.py test by test, most important first: a renamed test fails here, on the CPU."""
    import re

    listed = re.search(r"VLLM_TESTS=\(([^)]*)\)", (REPO / "bench" / "gpu_check.sh").read_text()).group(1).split()
    defined = set(re.findall(r"^def (test_\w+)", (REPO / "tests" / "test_vllm.py").read_text(), re.M))
    assert listed and set(listed) == defined and len(listed) == len(defined), set(listed) ^ defined
