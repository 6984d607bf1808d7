"""Which model a script's optimizer trains (porter.verify.weights.model_of), the original whose
initial weights a JAX port's side loads: the model the script built, not a layer of it that
holds the same parameters, and not a wrapper whose state dict prefixes the names."""
import torch
from torch import nn

from porter.verify.weights import model_of


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.layers(x)


def test_a_model_whose_layers_are_one_sequential_is_the_model():
    model = Wrapped()
    assert model_of(torch.optim.SGD(model.parameters(), lr=0.1)) is model
    assert model_of(torch.optim.SGD(model.layers.parameters(), lr=0.1)) is model  # the same parameters


def test_a_data_parallel_wrapper_gives_way_to_its_module():
    model = Wrapped()
    wrapper = nn.DataParallel(model)
    assert model_of(torch.optim.SGD(wrapper.parameters(), lr=0.1)) is model


def test_a_part_of_a_model_trained_alone():
    model = nn.Sequential(Wrapped(), nn.Linear(2, 2))
    head = model[1]
    assert model_of(torch.optim.SGD(head.parameters(), lr=0.1)) is head
