"""Test configuration: one command runs what the machine can.

Tests marked ``gpu`` need CUDA and are skipped cleanly without it. Tests marked ``full`` (the
rest of the CPU matrix, beyond a default subset that covers every regime boundary) run only with
``pytest --full``, on any machine, so ``pytest --full`` on a GPU machine runs everything.
Without CUDA, flashsplit's Triton kernels run through the interpreter (asked for here, before
flashsplit is imported, as a user would), and CuteDSL kernels compile for sm_90a without
launching (``CUTE_DSL_ARCH``, which cutlass reads when it is first imported, whichever test
imports it first).
"""

import os
import zlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import flashsplit  # noqa: E402,F401  (its Triton kernels are defined once, with the interpreter chosen)


FULL_SKIP_REASON = "full CPU matrix: run with pytest --full"


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="also run the tests marked full: the whole CPU matrix (what CI runs); the default run "
                          "keeps a subset that covers every regime boundary")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_full = pytest.mark.skip(reason=FULL_SKIP_REASON)
    full = config.getoption("--full")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "full" in item.keywords and not full:
            item.add_marker(skip_full)


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


def _flag_fixture(flag: str, doc: str):
    """A fixture that switches ``flashsplit.cute.configs.<flag>`` on for one test."""

    @pytest.fixture
    def fixture(monkeypatch):
        yield from _enable_unverified(monkeypatch, flag)

    fixture.__doc__ = f"{doc} (flashsplit.cute.configs.{flag})."
    return fixture


# One per cute *_VERIFIED_ON_GPU flag: the GPU tests that verify a gated kernel switch it on.
cute_paged_enabled = _flag_fixture("PAGED_VERIFIED_ON_GPU", "Paged KV in the cute backend")
cute_fp8_enabled = _flag_fixture("FP8_VERIFIED_ON_GPU", "fp8 caches in the cute backend")
cute_subtile_enabled = _flag_fixture("SUBTILE_PAGES_VERIFIED_ON_GPU", "Pages smaller than the cute KV tile")
cute_fp16_operands_enabled = _flag_fixture("FP16_OPERANDS_VERIFIED_ON_GPU",
                                           "fp16 wgmma operands for fp8 caches with a bf16 q")
cute_gather_enabled = _flag_fixture("GATHER_PAGES_VERIFIED_ON_GPU",
                                    "Pages the cute kernel gathers row by row (neither whole-tile nor sub-tile)")
cute_fp8_qk_enabled = _flag_fixture("FP8_QK_VERIFIED_ON_GPU", "e4m3 Q K^T wgmma straight from the fp8 K stage")


@pytest.fixture
def cute_merge_enabled(monkeypatch):
    """The cute split kernel's last-CTA merge for every split count (no combine kernel;
    flashsplit.cute.configs.MERGE_VERIFIED_ON_GPU, CuteBackend.merge_max_splits)."""
    from flashsplit.cute.backend import CuteBackend
    from flashsplit.plan import MAX_SPLITS

    monkeypatch.setattr(CuteBackend, "merge_max_splits", MAX_SPLITS)
    yield from _enable_unverified(monkeypatch, "MERGE_VERIFIED_ON_GPU")
