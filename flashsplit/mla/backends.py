"""Registers the built-in MLA backends (none imports a GPU library eagerly)."""

from .cute_backend import CuteMlaBackend
from .registry import register
from .triton_backend import TritonMlaBackend

register(TritonMlaBackend())
register(CuteMlaBackend())
