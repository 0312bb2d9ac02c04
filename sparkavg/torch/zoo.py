"""Ready-made module factories (importable by name on every executor
where sparkavg is installed): ``"sparkavg.torch.zoo:lenet"``,
``"sparkavg.torch.zoo:resnet"``, ``"sparkavg.torch.zoo:lstm"``, ..."""
from __future__ import annotations

from torch import nn

from ..references import factory

__all__ = ["lenet", "lstm", "mlp", "resnet"]


@factory
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


@factory
def mlp(inputs: int, hidden: int = 32, outputs: int = 2, batch_norm: bool = False) -> nn.Module:
    """Flatten -> dense ``hidden`` (BatchNorm1d if asked) relu -> ``outputs``."""
    layers = [nn.Flatten(), nn.Linear(inputs, hidden)]
    if batch_norm:
        layers.append(nn.BatchNorm1d(hidden))
    layers += [nn.ReLU(), nn.Linear(hidden, outputs)]
    return nn.Sequential(*layers)



class _Residual(nn.Module):
    """conv 3x3 -> BatchNorm -> relu -> conv 3x3 -> BatchNorm, plus the input, then relu."""

    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        return nn.functional.relu(self.body(x) + x)


def _conv_bn(cin: int, cout: int) -> list:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


@factory
def resnet(num_classes: int = 10, width: int = 16, channels: int = 1, size: int = 28) -> nn.Module:
    """The small ResNet of ``examples/mnist_resnet.py`` as a torch module for
    ``channels x size x size`` inputs (``size`` divisible by 4): stem conv
    3x3 x ``width`` + BatchNorm + relu, a residual block of ``width``,
    max-pool 2, conv 3x3 x 2 ``width`` + BatchNorm + relu, a residual block
    of 2 ``width``, max-pool 2, dense logits.  He-normal conv weights; the
    convolutions before a BatchNorm have no bias (its gradient would be
    rounding noise, which Adam amplifies).  At width 16 on 1x28x28: 43,770
    parameters and 288 running-statistics values (plus 6 batch counters)."""
    if size % 4:
        raise ValueError(f"Expect size divisible by 4, got {size!r}")
    model = nn.Sequential(
        *_conv_bn(channels, width), _Residual(width), nn.MaxPool2d(2),
        *_conv_bn(width, 2 * width), _Residual(2 * width), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * width * (size // 4) ** 2, num_classes))
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    return model


class _RowLSTM(nn.Module):
    """An LSTM over ``(batch, steps, features)`` (a ``(batch, 1, steps,
    features)`` image is read row by row), classified from its last hidden
    state."""

    def __init__(self, features: int, units: int, num_classes: int):
        super().__init__()
        self.lstm = nn.LSTM(features, units, batch_first=True)
        self.head = nn.Linear(units, num_classes)

    def forward(self, x):
        if x.dim() == 4:
            x = x.flatten(1, 2)  # (N, 1, H, W) -> H steps of W pixels
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


@factory
def lstm(num_classes: int = 10, units: int = 128, features: int = 28) -> nn.Module:
    """The row LSTM of ``examples/mnist_lstm.py`` as a torch module: an
    image's rows as time steps (28 steps of 28 pixels for MNIST; give the
    model ``input_shape=(28, 28)`` or ``(1, 28, 28)``), LSTM(``units``),
    dense logits from its last hidden state.  PyTorch's default init.  At
    128 units: 82,186 parameters."""
    return _RowLSTM(features, units, num_classes)
