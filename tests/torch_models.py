"""Torch module factories of the tests, named "tests.torch_models:NAME":
Spark's Python workers import them as a user's executors import their own
package (the tests' conftest puts the repository root on the executors'
PYTHONPATH).  The factories and the loss are marked, as a user marks the code
their saved models name, so that model files and checkpoints of them load;
``unmarked_mlp`` is not (a loader refuses it unless trusted)."""
import torch
from torch import nn

import sparkavg
from sparkavg.torch import factory


@factory
def mlp(inputs: int = 16, hidden: int = 8, outputs: int = 2) -> nn.Module:
    """Flatten -> dense relu -> logits (the torch twin of tests.nets.small_net)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, outputs))


@factory
def conv_bn(classes: int = 2) -> nn.Module:
    """A tiny conv net with BatchNorm2d (running statistics: buffers) for 1x4x4 inputs (no conv
    bias before the BatchNorm: its gradient is rounding noise, which Adam would amplify)."""
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16, classes))


class _LastStep(nn.Module):
    """An LSTM over (T, F) sequences classified from its last hidden state."""

    def __init__(self, features, hidden, classes):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


@factory
def lstm(features: int = 4, hidden: int = 6, classes: int = 2) -> nn.Module:
    return _LastStep(features, hidden, classes)


@factory
def regressor(inputs: int = 3) -> nn.Module:
    return nn.Linear(inputs, 1)


@factory
def not_a_module():
    return "not a module"


@sparkavg.loss
def huber(outputs, targets):
    """A custom loss by name (mean Huber loss)."""
    return torch.nn.functional.huber_loss(outputs, targets)


def unmarked_mlp(inputs: int = 16, hidden: int = 8, outputs: int = 2) -> nn.Module:
    """:func:`mlp`, not marked: fine in code that names it, refused by a loader unless trusted."""
    return mlp(inputs, hidden, outputs)


def unmarked_huber(outputs, targets):
    """:func:`huber`, not marked."""
    return torch.nn.functional.huber_loss(outputs, targets)
