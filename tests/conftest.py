"""Test configuration: one command runs what the machine can.

Tests marked ``gpu`` need CUDA and are skipped cleanly without it; tests marked ``cpu`` decode
CPU tensors, which only the Triton interpreter runs, and are skipped on a CUDA machine (where the
interpreter is off and their ``*_gpu.py`` twins run). Tests marked ``full`` (the
rest of the CPU matrix, beyond a default subset that covers every regime boundary) run only with
``pytest --full``, on any machine, so ``pytest --full`` on a GPU machine runs everything.
Without CUDA, flashsplit's Triton kernels run through the interpreter (asked for here, before
flashsplit is imported, as a user would), and CuteDSL kernels compile for sm_90a without
launching (``CUTE_DSL_ARCH``, which cutlass reads when it is first imported, whichever test
imports it first).
"""

import contextlib
import importlib.util
import os
import re
import warnings
import zlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import flashsplit  # noqa: E402,F401  (its Triton kernels are defined once, with the interpreter chosen)
from flashsplit.cute.backend import CUTLASS_MISSING  # noqa: E402  (a string: imports no cutlass)


FULL_SKIP_REASON = "full CPU matrix: run with pytest --full"

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
#: A test that plans or compiles for the cute backend: it needs the [hopper] extra.
NEEDS_CUTLASS = pytest.mark.skipif(not HAS_CUTLASS, reason=CUTLASS_MISSING)

HAS_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
#: The marks of a module that launches the cute backend: a Hopper GPU and nvidia-cutlass-dsl.
CUTE_GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_SM90, reason="needs a CUDA device of compute capability 9.0"),
    NEEDS_CUTLASS,
]


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="also run the tests marked full: the whole CPU matrix (what CI runs); the default run "
                          "keeps a subset that covers every regime boundary")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_cpu = pytest.mark.skip(reason="decodes CPU tensors through the Triton interpreter, which is off where CUDA is")
    skip_full = pytest.mark.skip(reason=FULL_SKIP_REASON)
    full = config.getoption("--full")
    for item in items:
        if item.get_closest_marker("gpu") and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("cpu") and HAS_CUDA:
            item.add_marker(skip_cpu)
        if item.get_closest_marker("full") and not full:
            item.add_marker(skip_full)


@contextlib.contextmanager
def torch_notice_silenced(message: str):
    """Silence torch's UserWarning that starts with ``message``: its notice about a tensor kind
    (ComplexHalf, sparse CSR) that a test builds on purpose, to see flashsplit refuse or handle it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape(message), category=UserWarning)
        yield


@pytest.fixture
def generator(request):
    """A CPU generator seeded from the test's id: different data in every test, the same data
    when a failing test is rerun."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g
