"""Registers the built-in backends. No registration imports a GPU library eagerly."""

from .cute.backend import CuteBackend
from .registry import register
from .triton.backend import TritonBackend

register(TritonBackend())
register(CuteBackend())
