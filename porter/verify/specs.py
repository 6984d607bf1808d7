"""Input specifications: ``float32[8,3,32,32]``, ``int64[8,128]<30000``, ``int64[4]<10>=2``.

Inputs are generated with numpy from a seed, so every side (torch, torch_xla, later JAX or
MXNet in other interpreters) receives identical values through an .npz file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np

_SPEC = re.compile(
    r"^\s*(?P<dtype>[a-z]+[0-9]*)\s*\[(?P<shape>[0-9,\s]*)\]\s*(?:<\s*(?P<high>-?\d+))?\s*(?:>=\s*(?P<low>-?\d+))?\s*$"
)
_DTYPES = {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class InputSpec:
    dtype: str
    shape: tuple[int, ...]
    high: Optional[int] = None  # integers: values in [low, high)
    low: int = 0

    @classmethod
    def parse(cls, text: str) -> "InputSpec":
        m = _SPEC.match(text)
        if not m:
            raise SpecError(f"bad input spec {text!r}; expected e.g. float32[8,3,32,32] or int64[8,128]<30000")
        dtype = m.group("dtype")
        if dtype not in _DTYPES:
            raise SpecError(f"unknown dtype {dtype!r} in {text!r} (known: {', '.join(sorted(_DTYPES))})")
        shape = tuple(int(s) for s in m.group("shape").split(",") if s.strip())
        high = int(m.group("high")) if m.group("high") else None
        low = int(m.group("low")) if m.group("low") else 0
        if dtype.startswith(("int", "uint")) and high is None:
            raise SpecError(f"integer input {text!r} needs an upper bound, e.g. {text}<1000")
        if high is not None and high <= low:
            raise SpecError(f"empty value range in {text!r}")
        return cls(dtype, shape, high, low)

    def generate(self, rng: np.random.Generator) -> np.ndarray:
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.dtype.startswith(("int", "uint")):
            return rng.integers(self.low, self.high, size=self.shape).astype(self.dtype)
        values = rng.standard_normal(self.shape)
        if self.high is not None:
            values = rng.uniform(self.low, self.high, size=self.shape)
        # bfloat16 has no numpy dtype: generated as float32, cast on the side
        return values.astype("float32" if self.dtype == "bfloat16" else self.dtype)

    def __str__(self) -> str:
        rng = f"<{self.high}" if self.high is not None else ""
        low = f">={self.low}" if self.low else ""
        return f"{self.dtype}[{','.join(map(str, self.shape))}]{rng}{low}"
