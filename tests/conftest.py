"""Test configuration: one command runs what the machine can.

Tests marked ``gpu`` need CUDA and are skipped cleanly without it (on the H200 the same
``pytest`` command runs everything). Without CUDA, flashsplit runs its Triton kernels through
the interpreter (set up by ``flashsplit.triton`` before any kernel is defined), and CuteDSL
kernels compile for sm_90a without launching (``CUTE_DSL_ARCH``, which cutlass reads when it is
first imported, whichever test imports it first).
"""

import os
import zlib

import pytest
import torch

import flashsplit  # noqa: F401  (sets TRITON_INTERPRET before triton kernels are defined)

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
if not HAS_CUDA:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def generator(request):
    """A CPU generator seeded from the test's id: different data in every test, the same data
    when a failing test is rerun."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g
