"""Ready-made module factories (importable by name on every executor
where sparkavg is installed): ``"sparkavg.torch.zoo:lenet"`` ..."""
from __future__ import annotations

from torch import nn

__all__ = ["lenet", "mlp"]


def lenet(num_classes: int = 10) -> nn.Module:
    """The seeds' LeNet (:func:`sparkavg.nn.zoo.lenet`) as a torch module for
    1x28x28 inputs: conv 5x5x20 -> max-pool 2 -> conv 5x5x50 -> max-pool 2
    -> dense 500 relu -> logits; DL4J's Xavier init (normal, sd =
    sqrt(2 / (fan_in + fan_out))), zero biases.  431,080 parameters."""
    model = nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2),
        nn.Conv2d(20, 50, 5), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
        nn.Linear(500, num_classes))
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_normal_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def mlp(inputs: int, hidden: int = 32, outputs: int = 2, batch_norm: bool = False) -> nn.Module:
    """Flatten -> dense ``hidden`` (BatchNorm1d if asked) relu -> ``outputs``."""
    layers = [nn.Flatten(), nn.Linear(inputs, hidden)]
    if batch_norm:
        layers.append(nn.BatchNorm1d(hidden))
    layers += [nn.ReLU(), nn.Linear(hidden, outputs)]
    return nn.Sequential(*layers)

