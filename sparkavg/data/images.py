"""Encoded images (PNG, JPEG, BMP, ... bytes) decoded to uint8 arrays in a model's input shape.

A DataFrame whose features column is ``binary`` -- one encoded image per
row, as Spark's ``binaryFile`` source or a Parquet dataset of image files
gives them -- is decoded on the executors, where its rows are read
(:func:`sparkavg.spark.executor.arrow.read_features`): for training once per
fit while its minibatches are prepared (each epoch when they are streamed),
for ``predict``/``evaluate``/``transform`` per batch.  Pixels stay uint8
(a quarter of float32's bytes) until a minibatch is trained; declare a
scale with ``DataOptions(scale=1/255)`` as for any uint8 features.

The decoder is Pillow, the optional extra ``images``
(``pip install 'sparkavg[images]'``), imported only when a binary column is
read.  Nothing is resized or cropped silently: an image whose size is not
the input shape's is an error naming its row, the size it has and the one
expected.  Channels follow the input shape: ``(1, H, W)``, ``(H, W)`` and
``(H * W,)`` decode to grayscale (Pillow's ``"L"``: ITU-R 601-2 luma from
colour images), ``(3, H, W)`` to RGB and ``(4, H, W)`` to RGBA, channels
first as the engine's convolutions take them.
"""
from __future__ import annotations

import io
from typing import Callable, Optional, Sequence

import numpy as np

from .validation import DataValidationError

__all__ = ["decode_images", "image_layout"]

_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def _pillow():
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("Expect Pillow to decode a binary features column (encoded images), got no module "
                          "'PIL' in this Python: pip install 'sparkavg[images]' (or Pillow) on the driver and "
                          "every executor") from exc
    return Image


def image_layout(shape: Sequence[int]) -> tuple:
    """``(channels, height, width)`` of the images an input shape takes:
    ``(C, H, W)`` with C 1, 3 or 4; ``(H, W)`` grayscale; ``(n,)`` a
    grayscale image of n pixels, whatever its height and width (0 for both)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 3 and shape[0] in _MODES:
        return shape
    if len(shape) == 2:
        return (1,) + shape
    if len(shape) == 1:
        return (1, 0, 0)
    raise ValueError(f"Expect an input shape images can fill -- (C, H, W) with C 1, 3 or 4, (H, W) or (pixels,) -- "
                     f"for a binary features column (encoded images), got {shape}")


def _first_layout(image, values) -> tuple:
    """(C, H, W) of the first image: its own channels (grayscale, RGB, RGBA;
    other modes as RGB, or grayscale when they have no colour)."""
    img = image.open(io.BytesIO(values[0]))
    channels = {"L": 1, "RGB": 3, "RGBA": 4, "1": 1, "I": 1, "I;16": 1, "F": 1, "LA": 1}.get(img.mode, 3)
    return channels, img.size[1], img.size[0]


def decode_images(values: Sequence, shape: Optional[Sequence[int]], where: Callable[[int], str],
                  what: str = "features") -> np.ndarray:
    """Decode one encoded image per row into a uint8 ``(n, *shape)`` array
    (``shape`` None: ``(n, C * H * W)`` in the first image's size and
    channels, for paths that learn the input shape later).

    Parameters
    ----------
    values : sequence of bytes-like
        The encoded images (a pyarrow ``binary`` column's Python values, or
        a list of ``bytes``); no None.
    shape : tuple of int, or None
        The model's input shape (:func:`image_layout` says which it takes);
        None: the first image's.
    where : callable
        ``where(i)`` names row ``i`` in messages ("partition 3, row 12").
    what : str
        The value's name in messages.

    Raises
    ------
    DataValidationError
        A row that is not an image the decoder reads, or whose size or
        pixel count is not the input shape's (naming the row, what it has
        and what was expected).
    ValueError
        An input shape no image fills (:func:`image_layout`).
    """
    image = _pillow()
    if shape is None:
        if not len(values):
            return np.zeros((0, 0), np.uint8)
        try:
            layout = _first_layout(image, values)
        except Exception:  # named with its row below
            layout = (1, 1, 1)
        return decode_images(values, layout, where, what).reshape(len(values), -1)
    shape = tuple(int(s) for s in shape)
    channels, height, width = image_layout(shape)
    mode = _MODES[channels]
    out = np.empty((len(values),) + shape, np.uint8)
    for i, value in enumerate(values):
        if value is None:
            raise DataValidationError(f"Bad {what} at {where(i)}: expected an encoded image, got null")
        try:
            img = image.open(io.BytesIO(value))
            img.load()
        except Exception as exc:
            head = bytes(value[:8])
            raise DataValidationError(f"Bad {what} at {where(i)}: expected an encoded image (PNG, JPEG, ...), got "
                                      f"{len(value)} bytes Pillow cannot read (starting {head!r}: {exc})") from None
        if img.mode != mode:
            img = img.convert(mode)
        pixels = np.asarray(img)
        if height:  # the input shape names the size
            if pixels.shape[:2] != (height, width):
                raise DataValidationError(f"Bad {what} at {where(i)}: expected a {width}x{height} image (input "
                                          f"shape {shape}), got {pixels.shape[1]}x{pixels.shape[0]} (images are "
                                          f"not resized: resize them before training)")
            out[i] = pixels.reshape(height, width, channels).transpose(2, 0, 1).reshape(shape)
        else:
            if pixels.size != shape[0]:
                raise DataValidationError(f"Bad {what} at {where(i)}: expected an image of {shape[0]} pixels (input "
                                          f"shape {shape}), got {pixels.shape[1]}x{pixels.shape[0]} = "
                                          f"{pixels.size}")
            out[i] = pixels.reshape(shape)
    return out
