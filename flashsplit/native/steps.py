"""Which :class:`HostStep` :func:`flashsplit.decode` offers its next call to.

After each call that takes the Python path with a fresh output (what ``decode()`` makes), the
dispatch layer offers the call's signature and prepared launcher here; a launcher with a host
program (``host_program(tensors)``, a :class:`HostProgram`) gets a native step built from that
call, and ``decode()``'s next call goes to it first. Steps are kept per signature, and all are
dropped whenever the prepared launchers are (a backend registered, a cache cleared).
"""

from __future__ import annotations

from typing import NamedTuple

from . import STEP_ARGS, module
from ..call import DecodeOptions, DecodeTensors
from ..workspace import _SCRATCH

assert len(STEP_ARGS) == 17 and len(DecodeOptions._fields) == 8  # host_step.cpp's Arg enum


class HostProgram(NamedTuple):
    """A prepared launcher's launches for a native caller: what its Python eager path does."""

    device_index: int  #: the CUDA device of the signature's tensors
    raw_stream: object  #: ``raw_stream(device_index) -> int``: the current stream's handle
    capturing: object  #: ``capturing() -> bool``: whether the current stream is capturing a CUDA graph
    workspaces: dict  #: ``(device index, stream) -> (numel, address)`` of each stream's workspace
    counters: dict  #: ``(device index, stream) -> (count, address)`` of each stream's arrival counters
    workspace_numel: int  #: fp32 elements the launches need in the stream's workspace
    counter_count: int  #: arrival counters they need (0: none read)
    #: ``[(launch, sources)]``: ``launch.raw`` is (host function, void*[], per-call slots, result)
    #: addresses, one source ``(kind, DecodeTensors field, offset)`` per per-call slot.
    launches: list
    raise_cuda: object  #: ``raise_cuda(code)`` raises the error a host function reported


def build_step(program: HostProgram, tensors: DecodeTensors, options: DecodeOptions):
    """A native step for calls with ``tensors``' facts and ``options`` (None where the extension
    is unavailable or a launch has a per-call slot that is not an 8-byte integer)."""
    native = module()
    if native is None:
        return None
    launches = []
    for launch, sources in program.launches:
        codes = getattr(launch, "per_call_codes", None)
        if codes is None or len(codes) != len(sources) or any(code != "Q" for code in codes):
            return None
        launches.append((*launch.raw, list(sources)))
    state = (program.device_index, program.raw_stream, program.capturing, _SCRATCH, program.workspaces, program.counters,
             program.raise_cuda)
    keep = tuple(launch for launch, _ in program.launches)
    return native.HostStep(tuple(tensors), tensors.lse is not None, tuple(options), state, program.workspace_numel,
                           program.counter_count, launches, keep)


class HostSteps:
    """The step :func:`flashsplit.decode` tries first (``step``), and the steps built so far."""

    def __init__(self, max_size: int = 256):
        self.step = None  #: the last offered signature's step, or None
        self._key = None
        self._steps: dict = {}  # signature -> step, or False where none can be built
        self._max_size = max_size

    def offer(self, key, run, tensors: DecodeTensors, options: DecodeOptions) -> None:
        """After ``run(tensors)`` (the prepared launcher of signature ``key``) took the Python path
        for a ``decode()`` call: make its step the one tried next (building it once)."""
        make_program = getattr(run, "host_program", None)
        try:
            step = None if key is None or make_program is None else self._steps.get(key)
        except TypeError:  # an unhashable option: never cached
            key = None
        if key is None or make_program is None:
            self.step = None
            return
        if step is None:
            program = make_program(tensors)
            if program is None:  # not ready yet (its first launch has not run): try again next call
                self.step = None
                return
            step = (program and build_step(program, tensors, options)) or False  # False: none for this signature
            if len(self._steps) >= self._max_size:
                self._steps.clear()
            self._steps[key] = step
        self.step = step or None

    def clear(self) -> None:
        self.step = None
        self._steps.clear()
