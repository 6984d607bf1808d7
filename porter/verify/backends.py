"""Backends: how to run one side of a verification. One plug-in per framework.

A backend names the interpreter and the side module that runs a file of its framework; the
side reads a JSON request and writes the .npz + JSON protocol of ``side_torch``. Sides of
different frameworks live in different interpreters (the MXNet original needs its own venv),
so nothing but files crosses between them.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from porter.verify.warm import JAX_STACK, TORCH, TORCH_XLA_STACK


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # run as `python -m module REQUEST.json`
    device: str
    python: str = sys.executable
    env: dict = field(default_factory=dict)
    preload: tuple = ()  # what the side module imports before the user's code (porter.verify.warm)

    def environment(self) -> dict:
        from porter.verify.process import side_environment

        env = side_environment(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env


BACKENDS = {
    # the original's reference run: eager PyTorch on the CPU, CUDA calls served by the CPU
    "torch": Backend("torch", "porter.verify.side_torch", "cpu", env={"CUDA_VISIBLE_DEVICES": ""},
                     preload=TORCH),
    # the port on the XLA backend (CPU here; a TPU VM sets PJRT_DEVICE=TPU)
    "torch-xla": Backend("torch-xla", "porter.verify.side_torch", "xla",
                         env={"PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}, preload=TORCH_XLA_STACK),
    # a Flax NNX port (the JAX target): CPU here; a TPU VM sets JAX_PLATFORMS=tpu
    "jax": Backend("jax", "porter.verify.side_jax", "jax",
                   env={"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}, preload=JAX_STACK),
}

_IMPORTS = re.compile(r"^\s*(?:import|from)\s+([\w.]+)", re.M)


def imported_modules(source: str) -> set[str]:
    return {m.split(".")[0] for m in _IMPORTS.findall(source)}


def original_backend(path: Path) -> Backend:
    mods = imported_modules(path.read_text(encoding="utf-8", errors="replace"))
    if "mxnet" in mods:
        from porter.verify import mxnet_env

        try:
            python = mxnet_env.mxnet_python()
        except mxnet_env.MXNetEnvError as exc:
            raise ValueError(f"{path} is an MXNet original: {exc}") from None
        return Backend("mxnet", "porter.verify.side_mxnet", "cpu", python=python, preload=("mxnet",))
    return BACKENDS["torch"]


def port_backend(path: Path) -> Backend:
    mods = imported_modules(path.read_text(encoding="utf-8", errors="replace"))
    if "torch_xla" in mods:
        return BACKENDS["torch-xla"]
    if mods & {"jax", "flax"}:
        return BACKENDS["jax"]
    # a port that needed no torch_xla-specific code still runs on the XLA device
    return BACKENDS["torch-xla"]
