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


# ------------------------------------------------ torch optimizers and schedulers
@sparkavg.torch.optimizer
class MarkedSGD(torch.optim.SGD):
    """A user's optimizer class, marked: a loaded configuration may build it."""


class UnmarkedSGD(torch.optim.SGD):
    """:class:`MarkedSGD`, not marked: refused by a loader unless trusted."""


@sparkavg.torch.scheduler
class MarkedStepLR(torch.optim.lr_scheduler.StepLR):
    """A user's scheduler class, marked."""


# ------------------------------------------------ several inputs and outputs
class _TwoInputs(nn.Module):
    """An image and a vector of extra features, joined before the logits."""

    def __init__(self, extra: int, classes: int):
        super().__init__()
        self.image = nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.ReLU())
        self.head = nn.Linear(6 + extra, classes)

    def forward(self, image, extra):
        return self.head(torch.cat([self.image(image), extra], dim=1))


@factory
def two_inputs(extra: int = 3, classes: int = 2) -> nn.Module:
    return _TwoInputs(extra, classes)


class _IdsAndValues(nn.Module):
    """Category ids (int64) embedded, next to float values."""

    def __init__(self, categories: int, columns: int, values: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(categories, 2)
        self.head = nn.Linear(2 * columns + values, classes)

    def forward(self, ids, values):
        return self.head(torch.cat([self.embed(ids).flatten(1), values], dim=1))


@factory
def ids_and_values(categories: int = 5, columns: int = 2, values: int = 3, classes: int = 2) -> nn.Module:
    return _IdsAndValues(categories, columns, values, classes)


class _TwoHeads(nn.Module):
    """A shared body with a main and an auxiliary head, returned as a dict
    (``as_tuple``: a tuple, main first)."""

    def __init__(self, classes: int, as_tuple: bool):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU())
        self.main, self.aux = nn.Linear(8, classes), nn.Linear(8, classes)
        self.as_tuple = as_tuple

    def forward(self, x):
        h = self.body(x)
        main, aux = self.main(h), self.aux(h)
        return (main, aux) if self.as_tuple else {"logits": main, "aux": aux}


@factory
def two_heads(classes: int = 2, as_tuple: bool = False) -> nn.Module:
    return _TwoHeads(classes, as_tuple)


@sparkavg.loss
def main_and_aux(outputs, targets):
    """A loss over both heads: the main head's cross-entropy plus 0.3 of the auxiliary's."""
    main, aux = (outputs["logits"], outputs["aux"]) if isinstance(outputs, dict) else outputs
    return torch.nn.functional.cross_entropy(main, targets) + 0.3 * torch.nn.functional.cross_entropy(aux, targets)


@sparkavg.torch.training_step
def smoothed_step(module, batch):
    """A step of one's own: label-smoothed cross-entropy of the main head plus an L1 penalty on its outputs."""
    x, y = batch
    out = module(x)["logits"]
    return torch.nn.functional.cross_entropy(out, y, label_smoothing=0.1) + 1e-3 * out.abs().mean()


def unmarked_step(module, batch):
    """:func:`smoothed_step`, not marked."""
    return smoothed_step(module, batch)


@sparkavg.loss
def nll(outputs, targets):
    """The negative log-likelihood of log-probabilities (a module ending in log_softmax)."""
    return torch.nn.functional.nll_loss(outputs, targets)


# ----------------------------------------------- fine-tuning: a frozen backbone
class _BackboneHead(nn.Module):
    """A backbone (conv + BatchNorm + dense) and a head; ``freeze`` sets the
    backbone's parameters ``requires_grad=False``."""

    def __init__(self, classes: int, freeze: bool):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                                      nn.Linear(48, 8), nn.ReLU())
        self.head = nn.Linear(8, classes)
        for p in self.backbone.parameters():
            p.requires_grad_(not freeze)

    def forward(self, x):
        return self.head(self.backbone(x))


@factory
def backbone_head(classes: int = 2, freeze: bool = True) -> nn.Module:
    return _BackboneHead(classes, freeze)
