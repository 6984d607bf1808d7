"""The start of the small torch training scripts that the JAX step tests port and run
(tests/test_jax_grad_accum.py, test_jax_trainer_methods.py, test_jax_training_shapes.py): the
imports and a two-layer classifier `Net` (10 features, 4 classes), its class body open for the
methods a test adds."""

SMALL_NET = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x):
        return self.layers(x)
'''
