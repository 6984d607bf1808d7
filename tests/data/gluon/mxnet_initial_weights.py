"""Run a Gluon original unmodified (in the MXNet venv) and save its model's initial weights:
the parameters of the first block that `initialize()` is called on, written with
`save_parameters` at the first `trainer.step()` (after the first forward, so deferred shapes
are known; before any update). Used by tests/test_gluon_jax_scripts.py.

    MX_INIT=init.params python mxnet_initial_weights.py train.py ARGS
"""
import os
import runpy
import sys

from mxnet import gluon

blocks = []
saved = []
_initialize = gluon.Block.initialize
_step = gluon.Trainer.step


def initialize(self, *args, **kwargs):
    blocks.append(self)
    return _initialize(self, *args, **kwargs)


def step(self, *args, **kwargs):
    if not saved:
        blocks[0].save_parameters(os.environ["MX_INIT"])
        saved.append(True)
    return _step(self, *args, **kwargs)


gluon.Block.initialize = initialize
gluon.Trainer.step = step
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
