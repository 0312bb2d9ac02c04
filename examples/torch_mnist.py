#!/usr/bin/env python
"""PyTorch's own MNIST recipe (pytorch/examples mnist/main.py) trained by sparkavg.

    python examples/torch_mnist.py --mode local --epochs 1
    python examples/torch_mnist.py --mode averaging --master local[2] --workers 2 --report out.json
    python examples/torch_mnist.py --mode sharing --threshold 1e-3
    python examples/torch_mnist.py --mode local --export-onnx cnn.onnx

Everything is the recipe's: its ``Net`` (two convolutions, dropout, a dense
layer, ``log_softmax`` outputs), ``nll_loss``, ``Adadelta(lr=1.0)`` and
``StepLR(step_size=1, gamma=0.7)`` stepped after every epoch -- torch's own
optimizer and scheduler (``TorchModel(optimizer=, scheduler=)``), whose
state sparkavg averages like its own.  The recipe's input normalisation is
the module's first step (``mean``, ``std``: MNIST's by default).

To bring your own module, copy this file: the module's factory and the loss
are functions at the top level of a module that the Spark executors can
import (this file is shipped to them with ``SparkContext.addPyFile``; on a
cluster, install your package on every executor instead), and both are
marked (``@sparkavg.torch.factory``, ``@sparkavg.loss``) so that model files
and checkpoints naming them load.  Because the module ends in
``log_softmax``, the loss is a custom ``nll_loss`` with
``targets="classes"``; ``output()`` still gives probabilities (the softmax
of log-probabilities is the probabilities).

The flags and the report are those of ``mnist_lenet.py``
(``mnist_example.py``), plus ``--export-onnx PATH``: after training, the
model is written as ONNX (``model.export_onnx(path)``) and the report names
the file.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this file as module torch_mnist, mnist_example

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import sparkavg  # noqa: E402
from sparkavg.torch import TorchModel, factory  # noqa: E402

__all__ = ["Net", "net", "nll_loss", "build", "main"]

#: This module by the name executors import it (it is shipped to them as a file).
MODULE = "torch_mnist"


class Net(nn.Module):
    """pytorch/examples mnist/main.py's ``Net`` (1,199,882 parameters),
    normalising its 1x28x28 inputs first."""

    def __init__(self, mean: float = 0.1307, std: float = 0.3081, classes: int = 10):
        super().__init__()
        self.mean, self.std = mean, std
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = (x - self.mean) / self.std
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


@factory
def net(mean: float = 0.1307, std: float = 0.3081, classes: int = 10) -> nn.Module:
    """The recipe's ``Net``."""
    return Net(mean, std, classes)


@sparkavg.loss
def nll_loss(outputs, targets):
    """The recipe's loss: the mean negative log-likelihood of ``log_softmax`` outputs."""
    return F.nll_loss(outputs, targets)


def build(num_classes: int = 10, seed: int = 123, input_shape=(1, 28, 28)) -> TorchModel:
    """The recipe as a TorchModel: Adadelta(lr=1.0), StepLR(step_size=1, gamma=0.7) per epoch."""
    if tuple(input_shape) != (1, 28, 28):
        raise SystemExit(f"the recipe's Net takes 1x28x28 images, got {tuple(input_shape)} from the data")
    return TorchModel(f"{MODULE}:net", factory_kwargs={"classes": num_classes}, input_shape=(1, 28, 28),
                      loss=f"{MODULE}:nll_loss", targets="classes", seed=seed,
                      optimizer="torch.optim:Adadelta", optimizer_kwargs={"lr": 1.0},
                      scheduler="torch.optim.lr_scheduler:StepLR", scheduler_kwargs={"step_size": 1, "gamma": 0.7},
                      scheduler_interval="epoch")


def _export_flag(parser) -> None:
    parser.add_argument("--export-onnx", default=None, metavar="PATH",
                        help="after training, write the model as ONNX here (model.export_onnx)")


def _export(args, model, report) -> None:
    """``--export-onnx``: the trained model as ONNX, named in the report."""
    if args.export_onnx:
        model.export_onnx(args.export_onnx)
        report["onnx"] = os.path.abspath(args.export_onnx)


def main(argv=None) -> dict:
    """Parse the flags, train, evaluate, report (see the module doc)."""
    from mnist_example import main as run_example  # the runner: the driver's only (executors import the model)

    if "--export-onnx" in (sys.argv[1:] if argv is None else argv) and not hasattr(TorchModel, "export_onnx"):
        # before any training: the flag would fail at its end
        raise NotImplementedError("--export-onnx needs TorchModel.export_onnx(path), which this sparkavg does not "
                                  "have (ONNX export is a separate feature of sparkavg.torch)")
    return run_example(build, argv=argv, description=__doc__, name="torch-mnist", add_flags=_export_flag,
                       finish=_export, py_files=[os.path.abspath(__file__)])


if __name__ == "__main__":
    main()
