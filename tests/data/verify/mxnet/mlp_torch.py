"""A hand-written torch equivalent of fixtures/mxnet/mlp's ``get_mlp``, with the torch names
the MXNet side gives the Gluon model: it proves the name and layout mapping (tests only)."""
import torch
from torch import nn


class LinearReLU(nn.Linear):
    """Gluon's ``Dense(units, activation="relu")``: one layer, so the container's indices stay."""

    def forward(self, x):
        return torch.relu(super().forward(x))


def get_mlp(hidden=128, num_classes=10, dropout=0.2, in_features=784):
    return nn.Sequential(
        LinearReLU(in_features, hidden),
        nn.Dropout(dropout),
        LinearReLU(hidden, hidden // 2),
        nn.Linear(hidden // 2, num_classes),
    )


def get_mlp_without_dropout(hidden=128, num_classes=10, in_features=784):
    """The same layers without the Dropout: the indices, so the names, no longer fit (tests
    that the mapping is checked, not assumed)."""
    return nn.Sequential(LinearReLU(in_features, hidden), LinearReLU(hidden, hidden // 2),
                         nn.Linear(hidden // 2, num_classes))
