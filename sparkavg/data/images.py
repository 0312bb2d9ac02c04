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

The rules, checked on each image's header before a pixel is decoded (an
error names the row, what it has and what was expected):

- **Formats**: :data:`FORMATS` -- PNG, JPEG, BMP, GIF, TIFF and WEBP, which
  Pillow decodes in-process (itself or the libraries its wheels bundle).
  Any other is refused by name, without being parsed: EPS, for one, would
  reach Ghostscript, an external program.
- **Size**: the header's width x height must be the input shape's (or its
  pixel count, for a ``(pixels,)`` shape) before decoding, so a small file
  that declares a huge image costs nothing; without an input shape (the
  first image's size is taken), at most ``max_pixels`` (default
  :data:`MAX_PIXELS`), a bound of the call, not Pillow's global
  ``Image.MAX_IMAGE_PIXELS``.
- **One frame**: an animated or multi-page image (GIF, APNG, TIFF, WEBP) is
  refused, not trained on its first frame.
- **Depth**: 8-bit pixels as they are; 16-bit pixels become 8-bit by
  dividing by 256 (the high byte, ``v >> 8``), grayscale and colour alike
  (Pillow gives 16-bit colour as its high bytes; 16-bit grayscale, which
  Pillow would clip at 255, is scaled here).  Other modes -- 32-bit integer
  (``"I"``) or float (``"F"``) pixels, for instance -- are refused by name.
"""
from __future__ import annotations

import io
from typing import Callable, Optional, Sequence

import numpy as np

from .validation import DataValidationError

__all__ = ["decode_images", "image_layout", "FORMATS", "MAX_PIXELS"]

_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
#: The formats a binary features column may hold (Pillow's names): decoded in-process by Pillow or the
#: libraries its wheels bundle.  Any other is refused by name (EPS would run Ghostscript).
FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP")
#: Pixels an image may have when no input shape fixes its size (:func:`decode_images`' ``max_pixels``).
MAX_PIXELS = 1 << 24
#: Pillow modes of 8-bit pixels, and the channels each decodes to when the first image gives the layout.
_EIGHT_BIT = {"1": 1, "L": 1, "LA": 1, "La": 1, "P": 3, "PA": 3, "RGB": 3, "RGBA": 4, "RGBa": 4, "RGBX": 3,
              "CMYK": 3, "YCbCr": 3}
#: Pillow modes of 16-bit grayscale pixels: scaled to 8 bits by 1/256.
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


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


def _format_of(image, value) -> Optional[str]:
    """The format Pillow's plugins say ``value`` starts like (their header checks only: nothing parsed)."""
    image.init()
    prefix = bytes(value[:64])
    for name, (_, accept) in image.OPEN.items():
        try:
            if accept is not None and accept(prefix):
                return name
        except Exception:
            continue
    return None


def _open(image, value, i: int, where: Callable[[int], str], what: str):
    """The image of row ``i``, opened lazily (its header read, no pixel decoded), after the
    checks of the module docstring that need no input shape: format, one frame, depth."""
    if value is None:
        raise DataValidationError(f"Bad {what} at {where(i)}: expected an encoded image, got null")
    try:
        img = image.open(io.BytesIO(value), formats=FORMATS)
    except Exception as exc:
        name = _format_of(image, value)
        if name is not None and name not in FORMATS:
            raise DataValidationError(f"Bad {what} at {where(i)}: expected an image in one of {', '.join(FORMATS)}, "
                                      f"got {name} (other formats are refused, never handed to a decoder)") from None
        head = bytes(value[:8])
        raise DataValidationError(f"Bad {what} at {where(i)}: expected an encoded image ({', '.join(FORMATS)}), got "
                                  f"{len(value)} bytes Pillow cannot read (starting {head!r}: {exc})") from None
    frames = getattr(img, "n_frames", 1) if getattr(img, "is_animated", False) else 1
    if frames > 1:
        raise DataValidationError(f"Bad {what} at {where(i)}: expected a single-frame image, got a {img.format} of "
                                  f"{frames} frames (multi-frame images are refused, not trained on frame 1)")
    if img.mode not in _EIGHT_BIT and img.mode not in _SIXTEEN_BIT:
        raise DataValidationError(f"Bad {what} at {where(i)}: expected 8-bit or 16-bit grayscale or colour pixels, got "
                                  f"a {img.format} of Pillow mode {img.mode!r}")
    return img


def _first_layout(image, values, where: Callable[[int], str], what: str, max_pixels: int) -> tuple:
    """(C, H, W) of the first image: its own channels (grayscale, RGB, RGBA;
    other colour modes as RGB), from its header; at most ``max_pixels``."""
    img = _open(image, values[0], 0, where, what)
    width, height = img.size
    if width * height > max_pixels:
        raise DataValidationError(f"Bad {what} at {where(0)}: expected an image of at most {max_pixels} pixels "
                                  f"(max_pixels, without an input shape), got {width}x{height} = {width * height}")
    return _EIGHT_BIT.get(img.mode, 1), height, width


def _pixels(image, img, mode: str, i: int, where: Callable[[int], str], what: str, value) -> np.ndarray:
    """Decode an opened image to uint8 ``(H, W[, C])`` of ``mode`` (16-bit: the high byte)."""
    try:
        img.load()
    except Exception as exc:
        raise DataValidationError(f"Bad {what} at {where(i)}: expected an encoded image ({', '.join(FORMATS)}), got "
                                  f"{len(value)} bytes of a {img.format} Pillow cannot decode ({exc})") from None
    if img.mode in _SIXTEEN_BIT:  # v / 256, as Pillow reads 16-bit colour; never clipped at 255
        img = image.fromarray((np.asarray(img).astype(np.uint16) >> 8).astype(np.uint8), "L")
    if img.mode != mode:
        img = img.convert(mode)
    return np.asarray(img)


def decode_images(values: Sequence, shape: Optional[Sequence[int]], where: Callable[[int], str],
                  what: str = "features", max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Decode one encoded image per row into a uint8 ``(n, *shape)`` array
    (``shape`` None: ``(n, C * H * W)`` in the first image's size and
    channels, for paths that learn the input shape later).

    Parameters
    ----------
    values : sequence of bytes-like
        The encoded images (a pyarrow ``binary`` column's Python values, or
        a list of ``bytes``).
    shape : tuple of int, or None
        The model's input shape (:func:`image_layout` says which it takes);
        None: the first image's.
    where : callable
        ``where(i)`` names row ``i`` in messages ("partition 3, row 12").
    what : str
        The value's name in messages.
    max_pixels : int, default MAX_PIXELS
        Without ``shape``: the most pixels the first image may declare
        (with a shape, its size is the bound).

    Raises
    ------
    DataValidationError
        A row that breaks a rule of the module docstring -- null, another
        format, several frames, another pixel depth, a size or pixel count
        that is not the input shape's -- or that Pillow cannot decode
        (naming the row, what it has and what was expected); every rule
        but decoding is checked on the header, before the pixels are decoded.
    ValueError
        An input shape no image fills (:func:`image_layout`).
    """
    image = _pillow()
    if shape is None:
        if not len(values):
            return np.zeros((0, 0), np.uint8)
        layout = _first_layout(image, values, where, what, max_pixels)
        return decode_images(values, layout, where, what).reshape(len(values), -1)
    shape = tuple(int(s) for s in shape)
    channels, height, width = image_layout(shape)
    mode = _MODES[channels]
    out = np.empty((len(values),) + shape, np.uint8)
    for i, value in enumerate(values):
        img = _open(image, value, i, where, what)
        w, h = img.size  # from the header: nothing decoded yet
        if height and (h, w) != (height, width):
            raise DataValidationError(f"Bad {what} at {where(i)}: expected a {width}x{height} image (input "
                                      f"shape {shape}), got {w}x{h} (images are not resized: resize them before "
                                      f"training)")
        if not height and w * h != shape[0]:
            raise DataValidationError(f"Bad {what} at {where(i)}: expected an image of {shape[0]} pixels (input "
                                      f"shape {shape}), got {w}x{h} = {w * h}")
        pixels = _pixels(image, img, mode, i, where, what, value)
        out[i] = pixels.reshape(h, w, channels).transpose(2, 0, 1).reshape(shape)
    return out
