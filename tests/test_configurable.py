"""The one configuration vocabulary: to_config() / from_config(), registries,
and errors that name the field, the type expected and the value found."""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import numpy as np
import pytest

from sparkavg.configurable import ConfigError, Configurable, checked_arguments, from_config, register, registered
from sparkavg.nn import (SGD, Activation, Adagrad, Adam, AvgPool2D, Conv2D, Dense, Dropout, Layer, MaxPool2D,
                         Nadam, Nesterov, Network, Output, RMSProp, Updater)


# ------------------------------------------------------- test-only classes
class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


@register("test-part")
@dataclass(frozen=True)
class Part(Configurable):
    size: int = 1
    scale: float = 1.0


@register("test-part")
@dataclass(frozen=True)
class OtherPart(Configurable):
    name: str = "x"


@register("test-widget")
@dataclass(frozen=True)
class Widget(Configurable):
    count: int
    ratio: float = 0.5
    label: Optional[str] = None
    flag: bool = False
    window: int | tuple[int, int] = 3
    sizes: Sequence[int] = ()
    colour: Colour = Colour.RED
    mode: Literal["fast", "slow"] = "fast"
    part: Optional[Part] = None
    either: Part | OtherPart | None = None

    def __post_init__(self):
        object.__setattr__(self, "colour", Colour(self.colour))
        if self.count < 0:
            raise ValueError(f"Expect count >= 0, got {self.count}")


def _widget(**fields):
    return from_config({"type": "Widget", "count": 1, **fields}, kind="test-widget")


# --------------------------------------------------------------- round trips
ALL_LAYERS = [Conv2D(4, (3, 2), stride=(1, 2), padding=1, activation="relu", weight_init="he"),
              MaxPool2D(2), AvgPool2D((2, 3), stride=1), Dense(7, activation="tanh"), Activation("sigmoid"),
              Dropout(0.25), Output(3), Output(1, loss="mse")]
ALL_UPDATERS = [SGD(0.3), Nesterov(0.2, 0.8), Adagrad(0.1, 1e-5), RMSProp(0.1, 0.9, 1e-7), Adam(2e-3), Nadam()]


@pytest.mark.parametrize("obj", ALL_LAYERS + ALL_UPDATERS, ids=repr)
def test_every_layer_and_updater_round_trips_through_json(obj):
    config = obj.to_config()
    assert config["type"] == type(obj).__name__
    again = from_config(json.loads(json.dumps(config)), kind=type(obj)._config_kind)
    assert type(again) is type(obj) and again.to_config() == config


def _own(kind):
    """sparkavg's own registered types of ``kind`` (tests may register a user's)."""
    return {name for name, cls in registered(kind).items() if cls.__module__.startswith("sparkavg.")}


def test_registries_hold_exactly_the_concrete_classes():
    assert _own("layer") == {"Conv2D", "MaxPool2D", "AvgPool2D", "Dense", "Activation", "Dropout",
                                        "Output", "BatchNorm", "LayerNorm", "Flatten", "Reshape",
                                        "GlobalAvgPool", "GlobalMaxPool", "LSTM", "GRU", "Embedding", "Conv1D"}
    # the optional TorchOptimizer (sparkavg.torch) and model types (Graph, TorchModel) register when their
    # module is imported
    assert set(registered("updater")) - {"TorchOptimizer"} == {"SGD", "Nesterov", "Adagrad", "RMSProp", "Adam",
                                                               "Nadam"}
    from sparkavg.nn.loading import OPTIONAL_TYPES

    networks = registered("network")
    assert networks["Network"] is Network and set(networks) <= {"Network", *OPTIONAL_TYPES}
    assert registered("no-such-kind") == {}


def test_network_round_trips_and_rebuilds_the_same_initial_params():
    net = Network((1, 6, 6), [Conv2D(2, 3), MaxPool2D(2), Dense(5), Output(3)], updater=RMSProp(0.01),
                  l2=1e-4, seed=4)
    config = json.loads(json.dumps(net.to_config()))
    again = from_config(config, kind="network", expect=Network)
    assert again.to_config() == net.to_config() and np.array_equal(again.params, net.params)


def test_to_config_is_json_ready():
    w = Widget(count=np.int64(3), ratio=np.float32(0.25), window=(np.int32(2), 4), sizes=(1, 2),
               colour=Colour.BLUE, flag=np.bool_(True), part=Part(2))
    config = w.to_config()
    assert json.loads(json.dumps(config)) == config
    assert config == {"type": "Widget", "count": 3, "ratio": 0.25, "label": None, "flag": True, "window": [2, 4],
                      "sizes": [1, 2], "colour": "blue", "mode": "fast",
                      "part": {"type": "Part", "size": 2, "scale": 1.0}, "either": None}
    assert type(config["count"]) is int and type(config["flag"]) is bool
    again = from_config(config, kind="test-widget")
    assert again == Widget(count=3, ratio=0.25, window=(2, 4), sizes=[1, 2], colour=Colour.BLUE, flag=True,
                           part=Part(2))


# ------------------------------------------------------------ typed fields
@pytest.mark.parametrize("config,message", [
    ({"type": "Adam", "lr": "0.001"}, "Expect Adam.lr to be float or a Schedule config, got str '0.001'"),
    ({"type": "Nesterov", "momentum": [0.9]}, r"Expect Nesterov.momentum to be float, got list \[0.9\]"),
    ({"type": "SGD", "lr": True}, "Expect SGD.lr to be float or a Schedule config, got bool True"),
    ({"type": "SGD", "lr": None}, "Expect SGD.lr to be float or a Schedule config, got NoneType None"),
])
def test_updater_fields_of_the_wrong_type_are_named(config, message):
    with pytest.raises(ConfigError, match=message):
        from_config(config, kind="updater")


@pytest.mark.parametrize("config,message", [
    ({"type": "Dense", "units": "10"}, "Expect Dense.units to be int, got str '10'"),
    ({"type": "Dense", "units": 10.0}, "Expect Dense.units to be int, got float 10.0"),
    ({"type": "Dense", "units": True}, "Expect Dense.units to be int, got bool True"),
    ({"type": "Conv2D", "filters": 2, "kernel_size": "3"},
     r"Expect Conv2D.kernel_size to be int or \[int, int\], got str '3'"),
    ({"type": "Conv2D", "filters": 2, "kernel_size": [3, 3, 3]},
     r"Expect Conv2D.kernel_size to be int or \[int, int\], got list \[3, 3, 3\]"),
    ({"type": "MaxPool2D", "stride": ["2", 2]}, r"Expect MaxPool2D.stride to be int or \[int, int\], got list \['2', 2\]"),
    ({"type": "Dropout", "rate": "0.5"}, "Expect Dropout.rate to be float, got str '0.5'"),
    ({"type": "Output", "units": 3, "activation": 1}, "Expect Output.activation to be str, got int 1"),
])
def test_layer_fields_of_the_wrong_type_are_named(config, message):
    with pytest.raises(ConfigError, match=message):
        from_config(config, kind="layer")


def test_numpy_integers_and_floats_are_accepted_and_tuples_from_lists():
    layer = from_config({"type": "Conv2D", "filters": np.int64(4), "kernel_size": [np.int32(3), 2],
                         "stride": np.uint8(1)}, kind="layer")
    assert (layer.filters, layer.kernel_size, layer.stride) == (4, (3, 2), (1, 1))
    assert from_config({"type": "Adam", "lr": np.float32(0.5)}, kind="updater").lr == np.float32(0.5)
    assert from_config({"type": "SGD", "lr": 1}, kind="updater") == SGD(1)  # an int is a float
    assert _widget(window=[1, 2]).window == (1, 2)
    assert _widget(sizes=[1, 2]).sizes == [1, 2]


def test_generic_annotations():
    with pytest.raises(ConfigError, match=r"Expect Widget.sizes\[1\] to be int, got str 'b'"):
        _widget(sizes=[1, "b"])
    with pytest.raises(ConfigError, match=r"Expect Widget.sizes to be a list of int, got str '12'"):
        _widget(sizes="12")
    with pytest.raises(ConfigError, match=r"Expect Widget.mode to be one of \['fast', 'slow'\], got str 'medium'"):
        _widget(mode="medium")
    with pytest.raises(ConfigError, match="Expect Widget.flag to be bool, got int 1"):
        _widget(flag=1)
    with pytest.raises(ConfigError, match="Expect Widget.label to be str, got int 5"):
        _widget(label=5)
    assert _widget(label=None).label is None
    # enums: the constructor converts values and names the choices
    assert _widget(colour="blue").colour is Colour.BLUE
    with pytest.raises(ConfigError, match="Bad Widget config: 'green' is not a valid Colour"):
        _widget(colour="green")


def test_nested_configs_are_rebuilt_and_their_errors_surface():
    w = _widget(part={"type": "Part", "size": 4}, either={"type": "OtherPart", "name": "n"})
    assert w.part == Part(4) and w.either == OtherPart("n")
    with pytest.raises(ConfigError, match="Widget.part: Expect Part.size to be int, got str '4'"):
        _widget(part={"type": "Part", "size": "4"})
    # in a union, the error of the alternative the config names, not a generic one
    with pytest.raises(ConfigError, match="Widget.either: Expect OtherPart.name to be str, got int 7"):
        _widget(either={"type": "OtherPart", "name": 7})
    with pytest.raises(ConfigError, match=r"Widget.part: Expect a Part config, got type 'OtherPart'"):
        _widget(part={"type": "OtherPart"})
    with pytest.raises(ConfigError, match="Expect Widget.part to be a Part config, got int 3"):
        _widget(part=3)


# ---------------------------------------------------------- structural errors
def test_unknown_type_wrong_kind_unknown_and_missing_arguments():
    with pytest.raises(ConfigError, match=r"Expect a layer type in \['Activation', .*\], got 'Conv3D'"):
        from_config({"type": "Conv3D"}, kind="layer")
    with pytest.raises(ConfigError, match="Expect a updater type in .* got 'Dense'"):
        from_config({"type": "Dense", "units": 3}, kind="updater")
    with pytest.raises(ConfigError, match=r"Expect Adam arguments among \['lr', 'beta1', 'beta2', 'eps'\], "
                                          r"got unknown \['momentum'\]"):
        from_config({"type": "Adam", "momentum": 0.9}, kind="updater")
    with pytest.raises(ConfigError, match=r"Expect Dense config with \['units'\], got keys \['activation'\]"):
        from_config({"type": "Dense", "activation": "relu"}, kind="layer")
    with pytest.raises(ConfigError, match="Expect a layer config dict with a 'type', got"):
        from_config({"units": 3}, kind="layer")
    with pytest.raises(ConfigError, match="Expect a layer config dict with a 'type', got"):
        from_config([1, 2], kind="layer")
    with pytest.raises(ConfigError, match=r"Expect a Updater config, got type 'Dense'"):
        from_config({"type": "Dense", "units": 3}, expect=Updater)
    with pytest.raises(ConfigError, match=r"Expect a layer type in .* got \['Dense'\]"):
        from_config({"type": ["Dense"]}, kind="layer")


def test_constructor_rejections_become_config_errors_naming_the_type():
    with pytest.raises(ConfigError, match="Bad Adam config: Expect lr > 0, got -1"):
        from_config({"type": "Adam", "lr": -1}, kind="updater")
    with pytest.raises(ConfigError, match="Bad Dense config: Expect units as an int >= 1, got 0"):
        from_config({"type": "Dense", "units": 0}, kind="layer")
    with pytest.raises(ConfigError, match="Bad Widget config: Expect count >= 0, got -2"):
        _widget(count=-2)
    assert issubclass(ConfigError, ValueError)


def test_checked_arguments_checks_without_constructing():
    cls, args = checked_arguments({"type": "Widget", "count": -2, "window": [1, 2],
                                   "part": {"type": "Part"}}, kind="test-widget")
    assert cls is Widget and args == {"count": -2, "window": (1, 2), "part": Part()}  # -2: the constructor's call
    with pytest.raises(ConfigError, match="Expect Widget.count to be int"):
        checked_arguments({"type": "Widget", "count": "1"}, kind="test-widget")


def test_register_refuses_a_second_class_of_the_same_name():
    with pytest.raises(ValueError, match="Expect one test-part class named 'Part', got a second"):
        @register("test-part")
        @dataclass(frozen=True)
        class Part(Configurable):  # noqa: F811 - the clash is the point
            size: int = 2


def test_layers_and_updaters_share_the_one_verb():
    for obj in ALL_LAYERS + ALL_UPDATERS:
        assert isinstance(obj, Configurable)
        assert not hasattr(obj, "get_config")
    assert isinstance(Dense(3), Layer) and "config" not in vars(Network)


def test_an_unregistered_subclass_is_refused_instead_of_saved_as_its_parent():
    class Doubled(Dense):  # a user's own layer, not registered
        def forward(self, x, training):
            return 2 * super().forward(x, training)

    with pytest.raises(ConfigError, match=r"got .*Doubled, a subclass of Dense that is not registered: its "
                                          r"configuration would rebuild a plain Dense.*register\('layer'\)"):
        Network((4,), [Doubled(3), Output(2)])
