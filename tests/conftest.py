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


def _enable_unverified(monkeypatch, flag: str):
    """Switch a cute ``*_VERIFIED_ON_GPU`` flag on for one test; cached backend choices are
    dropped before and after."""
    from flashsplit.cute import configs
    from flashsplit.registry import invalidate

    monkeypatch.setattr(configs, flag, True)
    invalidate()
    yield
    invalidate()


@pytest.fixture
def cute_paged_enabled(monkeypatch):
    """Let the cute backend take paged problems while its paged kernel awaits GPU verification
    (flashsplit.cute.configs.PAGED_VERIFIED_ON_GPU); the GPU tests that verify it use this."""
    yield from _enable_unverified(monkeypatch, "PAGED_VERIFIED_ON_GPU")


@pytest.fixture
def cute_fp8_enabled(monkeypatch):
    """The same for fp8 caches (flashsplit.cute.configs.FP8_VERIFIED_ON_GPU)."""
    yield from _enable_unverified(monkeypatch, "FP8_VERIFIED_ON_GPU")


@pytest.fixture
def cute_subtile_enabled(monkeypatch):
    """The same for pages smaller than the cute KV tile
    (flashsplit.cute.configs.SUBTILE_PAGES_VERIFIED_ON_GPU)."""
    yield from _enable_unverified(monkeypatch, "SUBTILE_PAGES_VERIFIED_ON_GPU")


@pytest.fixture
def cute_fp16_operands_enabled(monkeypatch):
    """fp16 wgmma operands for fp8 caches with a bf16 q
    (flashsplit.cute.configs.FP16_OPERANDS_VERIFIED_ON_GPU)."""
    yield from _enable_unverified(monkeypatch, "FP16_OPERANDS_VERIFIED_ON_GPU")


@pytest.fixture
def cute_gather_enabled(monkeypatch):
    """The same for pages the cute kernel gathers row by row (neither whole-tile nor sub-tile:
    flashsplit.cute.configs.GATHER_PAGES_VERIFIED_ON_GPU)."""
    yield from _enable_unverified(monkeypatch, "GATHER_PAGES_VERIFIED_ON_GPU")


@pytest.fixture
def cute_fp8_qk_enabled(monkeypatch):
    """e4m3 Q K^T wgmma straight from the fp8 K stage (flashsplit.cute.configs.FP8_QK_VERIFIED_ON_GPU)."""
    yield from _enable_unverified(monkeypatch, "FP8_QK_VERIFIED_ON_GPU")


@pytest.fixture
def cute_skip_padding_enabled(monkeypatch):
    """Warps whose rows are all padding skip the softmax
    (flashsplit.cute.configs.SKIP_PADDING_VERIFIED_ON_GPU)."""
    yield from _enable_unverified(monkeypatch, "SKIP_PADDING_VERIFIED_ON_GPU")


@pytest.fixture
def cute_merge_enabled(monkeypatch):
    """The cute split kernel's last-CTA merge for every split count (no combine kernel;
    flashsplit.cute.configs.MERGE_VERIFIED_ON_GPU, CuteBackend.merge_max_splits)."""
    from flashsplit.cute.backend import CuteBackend
    from flashsplit.plan import MAX_SPLITS

    monkeypatch.setattr(CuteBackend, "merge_max_splits", MAX_SPLITS)
    yield from _enable_unverified(monkeypatch, "MERGE_VERIFIED_ON_GPU")
