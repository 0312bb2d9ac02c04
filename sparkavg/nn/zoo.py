"""Ready-made networks."""
from __future__ import annotations

from .layers import Conv2D, Dense, MaxPool2D
from .output import Output
from .network import Network
from .updaters import Adam, Updater

__all__ = ["lenet"]


def lenet(num_classes: int = 10, seed: int = 123, updater: Updater | None = None,
          dtype: str = "float32") -> Network:
    """DL4J's LeNet (dl4j-examples) for 1x28x28 inputs.

    conv 5x5x20 stride 1 (identity) -> max-pool 2x2 -> conv 5x5x50 stride 1
    (identity) -> max-pool 2x2 -> dense 500 relu -> output softmax NLL;
    DL4J Xavier init (Gaussian, sd = sqrt(2 / (fan_in + fan_out))).
    431,080 parameters for 10 classes.

    The default updater is ``Adam(lr=1e-3)``: on Fashion-MNIST (inputs
    scaled to [0, 1]) it passes 0.86 test accuracy after one epoch at batch
    64 and 0.89 after five (see benchmarks/history/models.md).
    """
    layers = [
        Conv2D(20, 5, stride=1, activation="identity", weight_init="xavier"),
        MaxPool2D(2, 2),
        Conv2D(50, 5, stride=1, activation="identity", weight_init="xavier"),
        MaxPool2D(2, 2),
        Dense(500, activation="relu", weight_init="xavier"),
        Output(num_classes, activation="softmax", loss="nll", weight_init="xavier"),
    ]
    return Network((1, 28, 28), layers, updater=Adam(lr=1e-3) if updater is None else updater,
                   seed=seed, dtype=dtype)
