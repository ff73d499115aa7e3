"""How the learner and its generator workers signal each other, and how the learner's weights reach the workers.

Plumbing beside plumbing/generator.py, which says what the pool does and when; nothing here is DAPO.

Signals (`Control`): one int64 tensor in shared memory on the learner's host (the workers are its
children), each entry with a single writer, each read or written as one aligned 8-byte word, so
no entry is ever seen half-written and no lock is needed:

    learner (rank 0)   STOP (stop at the next batch boundary), PENDING (the weights version it
                       waits to send)
    worker 0           PRODUCED (batches sent), DECISION (what every worker does next at a batch
                       boundary, numbered, so that all K workers act alike: generation rounds are
                       collectives among them)
    worker c           READY[c] (the version it waits to receive), LOADED[c] (the version it
                       holds), BEATS[c] (a heartbeat: a thread adds 1 every HEARTBEAT_S)
    shared memory      VERSION (the version in its buffer; SharedMemoryWeights only)
    transport

Weights: the learner's full tensors, one at a time, in the order of its state dict, tagged with
their version and with the learner's log-probs of a fixed probe sequence (`probe_logprobs`),
which every worker checks after loading (plumbing/generator.py). Two transports behind one interface
(`send` on the learner, `receive` on a worker), chosen by --generator_weights:

    broadcast       torch.distributed broadcast on a process group of its own (the learner's rank
                    0 as root and the K workers; gloo on CPU, NCCL on GPU), each tensor received
                    in place into the worker's model: no host copy, and it works across hosts.
                    The group's timeout bounds every operation: a dead peer fails it at once
                    (its connections close), a stopped one after --generator_timeout_s.
    shared_memory   one flat buffer in host memory, written by the learner under a lock and read
                    by every worker under it; one host only.

Both run inside one rendezvous (generator.AsyncGenerator.publish): the learner sends version v
only once every worker has said READY[c] = v at a batch boundary, and waits until each has
received it, so the next version is never written while a worker still reads the last one.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as tdist

from plumbing import cli, forward

HEARTBEAT_S = 0.5  # a worker's heartbeat period (seconds); the learner's tolerance is --generator_timeout_s
POLL_S = 0.005  # how often a waiting side looks again at a shared entry (seconds)
WAIT_S = 0.5  # how often a process blocked on a lock looks whether its peer is still alive (seconds)
_ALIGN = 64  # bytes: every tensor of the shared-memory buffer starts at a multiple (any dtype can view it)

STOP, PENDING, VERSION, PRODUCED, DECISION = range(5)  # Control: the entries of the whole pool
_FIXED, _PER_WORKER = 5, 3  # then, per worker c: READY, LOADED, BEATS
GO, LOAD, QUIT = 1, 2, 3  # what the workers do next at a batch boundary (DECISION)


class PeerGone(cli.RunStopped):
    """The process on the other side of a wait or a transfer (a worker, or the learner) is gone or silent."""


class Control:
    """The pool's shared signals (module docstring): one int64 shared-memory tensor.

    Made by the learner (`create`); a worker gets the tensor among its spawn arguments (a handle
    of a few bytes: the memory is shared, not copied) and wraps it again with `Control(t)`.
    """

    def __init__(self, t: torch.Tensor):
        self.t = t  # (_FIXED + _PER_WORKER * workers,) int64, shared
        self.workers = (len(t) - _FIXED) // _PER_WORKER

    @classmethod
    def create(cls, workers: int) -> Control:
        """A fresh board in shared memory: (_FIXED + _PER_WORKER * workers,) int64; PENDING, VERSION
        and every worker's READY and LOADED at -1 (no version yet), heartbeats at 0."""
        t = torch.zeros(_FIXED + _PER_WORKER * workers, dtype=torch.int64).share_memory_()  # (entries,)
        t[PENDING] = t[VERSION] = -1
        t[_FIXED :: _PER_WORKER] = t[_FIXED + 1 :: _PER_WORKER] = -1  # READY, LOADED of each worker
        return cls(t)

    def __getitem__(self, entry: int) -> int:
        return int(self.t[entry])

    def __setitem__(self, entry: int, value: int) -> None:
        self.t[entry] = value

    def ready(self, c: int) -> int:
        return int(self.t[_FIXED + _PER_WORKER * c])

    def set_ready(self, c: int, version: int) -> None:
        self.t[_FIXED + _PER_WORKER * c] = version

    def loaded(self, c: int) -> int:
        return int(self.t[_FIXED + _PER_WORKER * c + 1])

    def set_loaded(self, c: int, version: int) -> None:
        self.t[_FIXED + _PER_WORKER * c + 1] = version

    def beats(self, c: int) -> int:
        return int(self.t[_FIXED + _PER_WORKER * c + 2])

    def beat(self, c: int) -> None:
        self.t[_FIXED + _PER_WORKER * c + 2] += 1  # one writer: no lost update

    # A decision is one word: number n (1, 2, ... for every worker alike), the action and the version,
    # packed so that a reader never sees the number of one decision with the action of another.
    def decide(self, n: int, action: int, version: int = -1) -> None:
        self.t[DECISION] = (n << 34) | ((version + 1) << 2) | action

    def decision(self, n: int) -> tuple[int, int] | None:
        """(action, version) of decision n once worker 0 has made it, else None."""
        word = int(self.t[DECISION])
        if word >> 34 != n:
            return None
        return word & 3, ((word >> 2) & ((1 << 32) - 1)) - 1


@contextlib.contextmanager
def holding(lock, peer_gone: Callable[[], str | None]):
    """`with lock:` for a lock shared with another process that may die holding it (then nobody
    ever releases it): waits WAIT_S at a time and raises PeerGone(reason) as soon as peer_gone()
    returns a reason (a string) instead of None."""
    while not lock.acquire(timeout=WAIT_S):
        reason = peer_gone()
        if reason:
            raise PeerGone(reason)
    try:
        yield
    finally:
        lock.release()


def layout(state: dict) -> list[tuple[str, torch.dtype, tuple]]:
    """[(name, dtype, shape)] of a state dict, in its order; an FSDP2 shard (DTensor) gives the full shape."""
    return [(name, t.dtype, tuple(t.shape)) for name, t in state.items()]


def check_layout(theirs: list, own: dict, model_name: str) -> None:
    """Raises RuntimeError unless a worker's model has exactly the learner's tensors (names, dtypes, shapes)."""
    mine = layout(own)
    if sorted(mine) != sorted(theirs):
        diff = sorted(set(map(str, mine)) ^ set(map(str, theirs)))[:5]
        raise RuntimeError(f"the generator's model {model_name} has other tensors than the learner's: {diff}")


def probe_logprobs(model, probe_ids: list[int], probe_len: int) -> torch.Tensor:
    """(probe_len,) float64 on the CPU, in nats: log-probs of the last probe_len tokens of probe_ids
    (1 <= probe_len < len(probe_ids)) under `model` at temperature 1. Under FSDP2 a collective: every
    rank calls it."""
    lp = forward.sequence_logprobs(model, probe_ids[:-probe_len], probe_ids[-probe_len:])  # (probe_len,)
    return lp.double().cpu()


def drain(items: Iterable) -> None:
    """Consume what is left of a weight stream: under FSDP2 each item is a collective of every learner rank."""
    for _ in items:
        pass


# --- broadcast --------------------------------------------------------------------------------------------


class BroadcastWeights:
    """The weights by torch.distributed broadcast on a process group of their own (module docstring).

    Members: rank 0 = the learner's rank 0 (the root), rank c + 1 = worker c. The group is made at
    the first transfer, when every member is at the rendezvous (its creation waits for all of them
    in the store). Tensors go in place: a worker receives each straight into its model's tensor
    (same name, dtype, shape: check_layout), on its device.
    """

    def __init__(self, spec: dict, store, rank: int, device: torch.device, timeout_s: float):
        self.layout, self.probe_len = spec["layout"], spec["probe_len"]
        self.store, self.rank, self.members, self.device = store, rank, spec["members"], device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.group = None

    def handles(self) -> tuple:
        return ()  # nothing shared: the members meet through the store

    def _group(self):
        if self.group is None:
            store = tdist.PrefixStore("weights", self.store)
            if self.device.type == "cuda":  # run on the CPU with a stand-in only (tests/test_gpu_path.py)
                opts = tdist.ProcessGroupNCCL.Options()
                opts._timeout = nccl_group_timeout(self.timeout)  # the poll (wait_for) ends a transfer first
                saved = os.environ.get(NCCL_ERRORS)
                os.environ[NCCL_ERRORS] = "2"  # read by this group's constructor only (NCCL_ERRORS)
                try:
                    self.group = tdist.ProcessGroupNCCL(store, self.rank, self.members, opts)
                finally:
                    if saved is None:
                        del os.environ[NCCL_ERRORS]
                    else:
                        os.environ[NCCL_ERRORS] = saved
            else:
                self.group = tdist.ProcessGroupGloo(store, self.rank, self.members, self.timeout)
        return self.group

    def _bcast(self, t: torch.Tensor, version: int, peer_gone: Callable[[], str | None] = lambda: None) -> None:
        """One broadcast from the root into `t`; raises PeerGone when the group cannot finish it: gloo raises
        RuntimeError (a member's connections closed, or the timeout passed); on NCCL `wait()` only orders the
        current CUDA stream after the work, neither blocking nor raising when a member is gone (the distributed
        docs' synchronous and asynchronous semantics, pytorch/pytorch PR 45709), so the CPU waits for the work
        itself with a deadline (wait_for)."""
        try:
            work = self._group().broadcast(t, 0)
            if self.device.type == "cuda":
                try:
                    wait_for(work, self.timeout.total_seconds(), peer_gone, f"the weight broadcast of version {version}")
                except PeerGone:
                    self.group.abort()  # the unfinished work and its communicator: the NCCL watchdog does not kill us
                    raise
                # finished by NCCL's watchdog on an error it saw first (NCCL_ERRORS). Work.exception prints once that
                # it is deprecated (pytorch/pytorch#46291); it is the one synchronous check of a non-blocking NCCL work
                if work.exception() is not None:
                    raise RuntimeError(str(work.exception()))
            else:
                work.wait()
        except RuntimeError as e:
            raise PeerGone(f"the weight broadcast of version {version} failed ({str(e).splitlines()[0][:300]})") from None

    def send(self, version: int, reference: torch.Tensor, items: Iterable, peer_gone: Callable[[], str | None]) -> None:
        """The learner: broadcast the version, the probe's reference log-probs, then each (name, full
        tensor) of `items` (rollout.stream_weights, consumed to the end whatever happens). Raises
        PeerGone when a member died or did not take part within the timeout."""
        items = iter(items)
        try:
            self._bcast(torch.tensor([version], dtype=torch.int64, device=self.device), version, peer_gone)  # (1,)
            self._bcast(reference.to(self.device, torch.float64), version, peer_gone)  # (probe_len,)
            for (name, _, _), (got, t) in zip(self.layout, items):
                if got != name:  # the same model on both sides: a different order is a bug
                    raise RuntimeError(f"weight stream out of order: {got!r} where {name!r} was expected")
                self._bcast(t.detach().to(self.device).contiguous(), version, peer_gone)
        finally:
            drain(items)

    def receive(self, own: dict, version: int, peer_gone: Callable[[], str | None]) -> torch.Tensor:
        """A worker: the tensors of `version` into its state dict `own` (in place); returns the learner's
        probe log-probs ((probe_len,) float64). Raises PeerGone as `send`, RuntimeError when the header carries another version."""
        header = torch.zeros(1, dtype=torch.int64, device=self.device)  # (1,)
        self._bcast(header, version, peer_gone)
        if int(header) != version:
            raise RuntimeError(f"worker waiting for weights version {version} received version {int(header)}")
        reference = torch.zeros(self.probe_len, dtype=torch.float64, device=self.device)  # (probe_len,)
        self._bcast(reference, version, peer_gone)
        with torch.no_grad():
            for name, _, _ in self.layout:
                self._bcast(own[name], version, peer_gone)  # contiguous parameters and buffers of the model, received in place
        return reference.cpu()


# The weight group on NCCL: TORCH_NCCL_ASYNC_ERROR_HANDLING, read by each ProcessGroupNCCL's constructor (torch's
# ProcessGroupNCCL.cpp), decides what its watchdog does on a timeout or an error NCCL reports (a peer's connection
# lost): 1 (what torchrun sets for its ranks) and 3 (torch's default) end the process, checkpoint or not; 2 aborts
# the group's communicators and leaves the process alive, the work finished with its error. The weight group is made
# with 2, and with a timeout longer than the learner's poll (wait_for), so that the poll, not the watchdog, ends a
# stalled transfer; a watchdog that sees an error first leaves an exception on the work, raised as PeerGone. Either
# way the learner aborts, checkpoints the step it trained and stops. The trainer's own group keeps torchrun's 1.
NCCL_ERRORS = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def nccl_group_timeout(poll: datetime.timedelta) -> datetime.timedelta:
    """The NCCL weight group's own timeout: twice the poll's deadline plus a minute (the watchdog never fires first)."""
    return 2 * poll + datetime.timedelta(seconds=60)


def wait_for(work, timeout_s: float, peer_gone: Callable[[], str | None], what: str) -> None:
    """Block until a collective's `work` is done (work.is_completed(), polled every POLL_S); raises PeerGone when
    peer_gone() gives a reason or timeout_s pass first. The learner then checkpoints and stops (a worker
    exits) after aborting the group (BroadcastWeights._bcast), as the NCCL watchdog would otherwise do at the
    group's own timeout by tearing the whole process down, checkpoint or not."""
    deadline = time.monotonic() + timeout_s
    while not work.is_completed():
        reason = peer_gone() or (time.monotonic() > deadline and f"{what} did not finish within {timeout_s:g} s")
        if reason:
            raise PeerGone(reason)
        time.sleep(POLL_S)


# --- shared memory ----------------------------------------------------------------------------------------


class SharedMemoryWeights:
    """The weights in one flat shared-memory buffer on the learner's host (module docstring).

    Made by the learner (`create`); a worker gets `handles()` among its spawn arguments (a few
    handles: the memory is shared, not copied) and rebuilds the object with the blob's spec.
    """

    def __init__(self, spec: dict, handles: tuple, control: Control, timeout_s: float):
        self.buffer, self.reference, self.lock = handles
        self.layout, self.probe_len, self.control, self.timeout_s = spec["layout"], spec["probe_len"], control, timeout_s
        offsets, _ = _offsets(self.layout)
        self._views = [self.buffer[off : off + torch.Size(shape).numel() * dtype.itemsize].view(dtype).view(shape)
                       for (_, dtype, shape), off in zip(self.layout, offsets)]  # one per tensor, built once

    @classmethod
    def create(cls, spec: dict, control: Control, ctx, timeout_s: float) -> SharedMemoryWeights:
        """The learner's side: allocates the buffer (bytes: every tensor, aligned) and the lock."""
        handles = (torch.zeros(_offsets(spec["layout"])[1], dtype=torch.uint8).share_memory_(),  # (bytes,)
                   torch.zeros(spec["probe_len"], dtype=torch.float64).share_memory_(),  # (probe_len,)
                   ctx.Lock())
        return cls(spec, handles, control, timeout_s)

    def handles(self) -> tuple:
        """(buffer, reference, lock): what a worker's spawn arguments carry to rebuild this object."""
        return self.buffer, self.reference, self.lock

    def views(self) -> list[torch.Tensor]:
        """One view into the buffer per tensor of the layout (no copy), with that entry's dtype and shape."""
        return self._views

    def send(self, version: int, reference: torch.Tensor, items: Iterable, peer_gone: Callable[[], str | None]) -> None:
        """The learner: copy each (name, full tensor) of `items` in (consumed to the end whatever
        happens), then the reference log-probs, and mark the buffer `version`. Raises PeerGone when
        a worker died holding the lock."""
        items = iter(items)
        try:
            with holding(self.lock, peer_gone):
                for ((name, _, _), view), (got, t) in zip(zip(self.layout, self.views()), items):
                    if got != name:
                        raise RuntimeError(f"weight stream out of order: {got!r} where {name!r} was expected")
                    view.copy_(t.detach())
                self.reference.copy_(reference.to(torch.float64))
                self.control[VERSION] = version
        finally:
            drain(items)

    def receive(self, own: dict, version: int, peer_gone: Callable[[], str | None]) -> torch.Tensor:
        """A worker: once the buffer holds `version`, copy it into the state dict `own`; returns the
        learner's probe log-probs ((probe_len,) float64, CPU). Raises PeerGone when the learner is gone, or has not written
        `version` within the timeout."""
        deadline = time.monotonic() + self.timeout_s
        while self.control[VERSION] != version:
            reason = peer_gone() or (time.monotonic() > deadline and
                                     f"the learner did not write weights version {version} within {self.timeout_s:g} s")
            if reason:
                raise PeerGone(reason)
            time.sleep(POLL_S)
        with holding(self.lock, peer_gone), torch.no_grad():
            for (name, _, _), view in zip(self.layout, self.views()):
                own[name].copy_(view)
            return self.reference.clone()


def make_spec(kind: str, state: dict, probe_len: int, workers: int) -> dict:
    """The transport's plain data for the workers' start-up blob (its size grows with the number of tensors):
    {"transport": kind, "layout": layout(state), "probe_len", "members": workers + 1 (the broadcast group's
    size: the learner's rank 0 and every worker)}. Raises ValueError for a kind other than broadcast or
    shared_memory."""
    if kind not in ("broadcast", "shared_memory"):
        raise ValueError(f"--generator_weights must be broadcast or shared_memory, got {kind!r}")
    return {"transport": kind, "layout": layout(state), "probe_len": probe_len, "members": workers + 1}


def learner_end(spec: dict, control: Control, ctx, store, device: torch.device, timeout_s: float):
    """The learner's end of the transport `spec` names: rank 0 of the broadcast group (its members
    meet through `store`, a TCPStore), or a new shared-memory buffer (spawned by `ctx`)."""
    if spec["transport"] == "broadcast":
        return BroadcastWeights(spec, store, 0, device, timeout_s)
    return SharedMemoryWeights.create(spec, control, ctx, timeout_s)


def worker_end(spec: dict, handles: tuple, control: Control, store, c: int, device: torch.device, timeout_s: float):
    """Worker c's end: rank c + 1 of the broadcast group, receiving onto `device`; or the learner's shared
    buffer rebuilt from its `handles()`."""
    if spec["transport"] == "broadcast":
        return BroadcastWeights(spec, store, c + 1, device, timeout_s)
    return SharedMemoryWeights(spec, handles, control, timeout_s)


def _offsets(entries: list) -> tuple[list[int], int]:
    """Byte offsets of a layout's tensors in the shared buffer (each aligned to _ALIGN), and its size in bytes."""
    offsets, size = [], 0
    for _, dtype, shape in entries:
        size = -(-size // _ALIGN) * _ALIGN
        offsets.append(size)
        size += torch.Size(shape).numel() * dtype.itemsize
    return offsets, size


def heartbeat(control: Control, c: int) -> Callable[[], None]:
    """A thread that adds 1 to worker c's heartbeat every HEARTBEAT_S while this process runs and
    its interpreter is not held (the learner's hang check, generator.AsyncGenerator._trouble); returns stop(),
    which ends the thread and waits for it (generator._end: a beat must never be in flight at the end)."""
    stopped = threading.Event()

    def beat() -> None:
        while not stopped.is_set():
            control.beat(c)
            stopped.wait(HEARTBEAT_S)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    return lambda: (stopped.set(), thread.join())
