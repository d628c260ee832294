"""What a CUDA graph forbids inside its captured region, enforced on CPU, where no graph can be captured.

A graph replays the kernels it recorded, with the addresses and scalars it recorded, and nothing of the Python that
launched them. So inside the region:
- no host sync: `Tensor.item/tolist/cpu/numpy`, `bool/int/float/index` of a tensor, `torch.cuda.synchronize`;
- no tensor built from host data (`torch.tensor`, `as_tensor`, `from_numpy`): its values would be frozen;
- no per-batch host value: the `*_cpu` lists of a ForwardBatch may be measured (`len`, the graph's fixed size),
  never read, since a replay would not read them again;
- no FlashInfer `plan()` (it copies to the host): `torch.cuda.is_current_stream_capturing()` reads True;
- every replay launches the same ops, with the same scalars, reading the same storage for every tensor that existed
  before the region: an op that a replay leaves out or adds, or a tensor that moved (a buffer re-allocated instead
  of refilled), would not be in the graph.

`GuardedCapture` is the stand-in graph (`CudaGraphRunner(capture=GuardedCapture)`): it runs the forward once under
these rules to capture it, and again under them at each replay, comparing the op trace with the captured one.
Kernels (Triton's interpreter, the FlashInfer stand-in's `run`) are single launches: their own host work is theirs.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from toolkit.runtime.forward_batch import ForwardBatch

HOST_FIELDS = ("seq_lens_cpu", "req_pool_indices_cpu", "extend_prefix_lens_cpu", "extend_seq_lens_cpu")
HOST_SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
HOST_DATA = ("tensor", "as_tensor", "from_numpy")


class CaptureViolation(AssertionError):
    """Something a CUDA graph cannot capture happened inside the captured region."""


class _State:
    guarding = False
    kernel_depth = 0
    trace: _Trace | None = None


def _active() -> bool:
    return _State.guarding and _State.kernel_depth == 0


class _LengthOnly:
    """A host list inside the region: its length is the graph's shape; its values are not the graph's."""

    def __init__(self, name: str, length: int) -> None:
        self.name, self.length = name, length

    def __len__(self) -> int:
        return self.length

    def _refuse(self, *args: object) -> None:
        raise CaptureViolation(f"ForwardBatch.{self.name} read inside the captured region: a replay would not "
                               "read it again")

    __iter__ = __getitem__ = __contains__ = __eq__ = _refuse


def _refusing(what: str, original: Callable) -> Callable:
    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _active():
            raise CaptureViolation(f"{what} inside the captured region")
        return original(*args, **kwargs)

    return guarded


def kernel(name: str) -> Callable[[Callable], Callable]:
    """Mark a function as one kernel launch: traced as a single op over its tensor arguments, and exempt from the
    rules inside (its host work is what the kernel does on the device)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def launch(*args: Any, **kwargs: Any) -> Any:
            outermost = _State.kernel_depth == 0
            _State.kernel_depth += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                _State.kernel_depth -= 1
            if outermost and _State.trace is not None:
                _State.trace.record(f"kernel:{name}", (args, kwargs), out)  # what it returns, it made
            return out

        return launch

    return decorate


# NOTE: allocations launch no kernel and are not replayed by a graph (its memory is fixed at capture).
ALLOCATIONS = frozenset({"aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default"})


class _Trace(TorchDispatchMode):
    """Every op of the region but allocations: its name, its scalars, and for each tensor its layout and where it
    lives: `made` (by an op of this run) or `outside` (it existed before the run), with its storage's address."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self._made: set[int] = set()
        self._outside: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _State.kernel_depth == 0:
            self.record(str(func), (args, kwargs or {}), out)
        return out

    def record(self, name: str, inputs: object, out: object) -> None:
        if name not in ALLOCATIONS:
            self.ops.append((name, tuple(self._describe(leaf) for leaf in pytree.tree_leaves(inputs))))
        for leaf in pytree.tree_leaves(out):
            address = _address(leaf) if isinstance(leaf, torch.Tensor) else None
            if address and address not in self._outside:
                self._made.add(address)

    def _describe(self, leaf: object) -> tuple:
        if not isinstance(leaf, torch.Tensor):
            return ("value", repr(leaf))
        address = _address(leaf)
        if address is None:
            return ("opaque", tuple(leaf.shape), leaf.dtype)
        origin = "made" if address in self._made else "outside"
        if origin == "outside":
            self._outside.add(address)
        return (origin, address, leaf.storage_offset(), leaf.stride(), tuple(leaf.shape), leaf.dtype)


def _same_leaf(captured: tuple, replayed: tuple) -> bool:
    """A tensor made during the run sits at a fresh address in every eager re-run (a graph's would not move), so
    made tensors match by layout; a tensor from outside must be the very storage the capture read, or made by the
    capture and kept since (a scratch buffer a backend caches)."""
    if captured[0] in ("value", "opaque") or replayed[0] in ("value", "opaque"):
        return captured == replayed
    if captured[2:] != replayed[2:]:
        return False
    if replayed[0] == "made":
        return captured[0] == "made"
    return captured[1] == replayed[1]


def _address(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr() or None
    except (RuntimeError, NotImplementedError):  # opaque (e.g. oneDNN-packed) weights have no storage to point at
        return None


@contextlib.contextmanager
def _patched(owner: object, name: str, value: object) -> Iterator[None]:
    had = name in vars(owner)
    original = vars(owner).get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def _forward_batch_getattribute() -> Callable:
    plain = ForwardBatch.__getattribute__

    def getattribute(self: ForwardBatch, name: str) -> Any:
        value = plain(self, name)
        if name in HOST_FIELDS and _active():
            return _LengthOnly(name, len(value))
        return value

    return getattribute


@contextlib.contextmanager
def capture_rules() -> Iterator[_Trace]:
    """Run a block as a captured region; yields the trace of its ops."""
    from triton.runtime.interpreter import InterpretedFunction

    patches = [(torch.Tensor, name, _refusing(f"Tensor.{name}() (a host sync)", getattr(torch.Tensor, name)))
               for name in HOST_SYNCS]
    patches += [(torch, name, _refusing(f"torch.{name}() (a tensor of host data)", getattr(torch, name)))
                for name in HOST_DATA]
    patches += [
        (torch.cuda, "synchronize", _refusing("torch.cuda.synchronize()", torch.cuda.synchronize)),
        (torch.cuda, "is_current_stream_capturing", lambda: _active()),
        (ForwardBatch, "__getattribute__", _forward_batch_getattribute()),
        (InterpretedFunction, "run", _triton_launch(InterpretedFunction.run)),
    ]
    trace = _Trace()
    with contextlib.ExitStack() as stack:
        for owner, name, value in patches:
            stack.enter_context(_patched(owner, name, value))
        stack.enter_context(trace)
        _State.guarding, _State.trace = True, trace
        try:
            yield trace
        finally:
            _State.guarding, _State.trace = False, None


def _triton_launch(run: Callable) -> Callable:
    def launch(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return kernel(f"triton:{self.fn.__name__}")(run)(self, *args, grid=grid, warmup=warmup, **kwargs)

    return launch


class GuardedCapture:
    """A CUDA graph's stand-in: captures `run` under the rules above, and at each replay runs it again under them,
    requiring the very op trace it captured."""

    def __init__(self, run: Callable[[], object]) -> None:
        self.run = run
        self.replays = 0
        with capture_rules() as trace:
            run()
        self.captured = trace.ops

    def replay(self) -> None:
        with capture_rules() as trace:
            self.run()
        assert_same_trace(self.captured, trace.ops)
        self.replays += 1


def assert_same_trace(captured: list[tuple], replayed: list[tuple]) -> None:
    for i, (ours, theirs) in enumerate(zip(captured, replayed)):
        same = ours[0] == theirs[0] and len(ours[1]) == len(theirs[1]) and all(
            _same_leaf(a, b) for a, b in zip(ours[1], theirs[1]))
        if not same:
            raise CaptureViolation(f"replay op {i} is not the captured graph's:\n captured {ours}\n replayed {theirs}")
    if len(captured) != len(replayed):
        raise CaptureViolation(f"the replay ran {len(replayed)} ops, the captured graph {len(captured)}")
