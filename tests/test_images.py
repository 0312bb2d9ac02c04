"""Encoded images in a binary column: decoded on the executors (sparkavg.data.images, Pillow)."""
from __future__ import annotations

import io
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

from sparkavg.data.images import decode_images, image_layout
from sparkavg.data.validation import DataValidationError

from .nets import blobs, small_net

Image = pytest.importorskip("PIL.Image", reason="Pillow is the optional extra 'images' (in the test extra)")


def _encode(pixels: np.ndarray, fmt: str = "PNG", mode: str | None = None, **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, mode).save(buf, format=fmt, **options)
    return buf.getvalue()


def _where(i):
    return f"row {i}"


def test_decodes_grayscale_and_colour_into_the_input_shape_channels_first():
    rng = np.random.default_rng(3)
    gray = rng.integers(0, 256, (5, 6, 7), dtype=np.uint8)  # 5 images, 6 high, 7 wide
    png = [_encode(g) for g in gray]
    np.testing.assert_array_equal(decode_images(png, (1, 6, 7), _where), gray[:, None])
    np.testing.assert_array_equal(decode_images(png, (6, 7), _where), gray)
    np.testing.assert_array_equal(decode_images(png, (42,), _where), gray.reshape(5, 42))
    np.testing.assert_array_equal(decode_images(png, None, _where), gray.reshape(5, 42))

    rgb = rng.integers(0, 256, (3, 6, 7, 3), dtype=np.uint8)  # height, width, channels as Pillow has them
    got = decode_images([_encode(c) for c in rgb], (3, 6, 7), _where)
    np.testing.assert_array_equal(got, rgb.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(decode_images([_encode(c) for c in rgb], None, _where),
                                  rgb.transpose(0, 3, 1, 2).reshape(3, -1))
    # colour into a grayscale input: Pillow's luma; lossy JPEG decodes to the right shape, near the pixels
    luma = decode_images([_encode(c) for c in rgb], (1, 6, 7), _where)
    expected = (rgb @ np.array([299, 587, 114]) / 1000.0)[:, None]
    assert np.abs(luma - expected).max() <= 1.0
    smooth = np.tile(np.linspace(0, 255, 16, dtype=np.uint8), (16, 1))[None]
    jpeg = decode_images([_encode(smooth[0], "JPEG")], (1, 16, 16), _where)
    assert jpeg.dtype == np.uint8 and np.abs(jpeg.astype(int) - smooth).mean() < 4


def test_names_the_row_and_what_was_expected():
    ok = _encode(np.zeros((4, 4), np.uint8))
    with pytest.raises(DataValidationError, match=r"Bad features at row 1: expected an encoded image \(PNG, "
                                                  r"JPEG, BMP, GIF, TIFF, WEBP\), got 5 bytes Pillow cannot read "
                                                  r"\(starting b'hello'"):
        decode_images([ok, b"hello"], (1, 4, 4), _where)
    with pytest.raises(DataValidationError, match=r"Bad features at row 0: expected a 4x4 image \(input shape "
                                                  r"\(1, 4, 4\)\), got 5x3 \(images are not resized"):
        decode_images([_encode(np.zeros((3, 5), np.uint8))], (1, 4, 4), _where)
    with pytest.raises(DataValidationError, match=r"row 0: expected an image of 10 pixels \(input shape \(10,\)\), "
                                                  r"got 4x4 = 16"):
        decode_images([ok], (10,), _where)
    with pytest.raises(DataValidationError, match="row 0: expected an encoded image, got null"):
        decode_images([None], (1, 4, 4), _where)
    with pytest.raises(ValueError, match=r"Expect an input shape images can fill .* got \(2, 4, 4\)"):
        image_layout((2, 4, 4))


def _png(pixels, bit_depth: int, colour_type: int, rows=None) -> bytes:
    """A PNG written by hand (Pillow writes no 16-bit colour): ``pixels`` (H, W[, C]) big-endian
    at ``bit_depth``; or ``pixels`` the (height, width) and ``rows`` an iterable of raw scanlines,
    for a large image."""
    height, width = pixels.shape[:2] if rows is None else pixels

    def chunk(kind, data):
        return struct.pack("!I", len(data)) + kind + data + struct.pack("!I", zlib.crc32(kind + data))

    if rows is None:
        dtype = ">u2" if bit_depth == 16 else "u1"
        rows = (pixels[y].astype(dtype).tobytes() for y in range(height))
    packer, idat = zlib.compressobj(9), []
    for row in rows:
        idat.append(packer.compress(b"\0" + row))
    idat.append(packer.flush())
    header = struct.pack("!IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(idat)) + chunk(b"IEND", b"")


def test_sixteen_bit_grayscale_and_colour_are_both_scaled_by_1_over_256():
    gray = np.array([[0x1234, 0xFFFF], [0x00FF, 0x0100]], np.uint16)  # Pillow's "L" would clip all to 255
    np.testing.assert_array_equal(decode_images([_png(gray, 16, 0)], (1, 2, 2), _where), (gray >> 8)[None, None])
    rgb = np.array([[[0xABCD, 0x0100, 0xFFFF], [0x1234, 0x00FF, 0x8000]]], np.uint16)  # 1 high, 2 wide
    got = decode_images([_png(rgb, 16, 2)], (3, 1, 2), _where)
    np.testing.assert_array_equal(got[0], (rgb >> 8).transpose(2, 0, 1))
    # 16-bit grayscale into a colour input: scaled, then repeated in every channel
    np.testing.assert_array_equal(decode_images([_png(gray, 16, 0)], (3, 2, 2), _where)[0],
                                  np.repeat((gray >> 8)[None], 3, axis=0))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP"])
def test_the_stated_formats_decode(fmt):
    pixels = np.tile(np.array([0, 255], np.uint8), (4, 2))  # 4x4, columns alternate
    got = decode_images([_encode(pixels, fmt, **({"lossless": True} if fmt == "WEBP" else {}))], (1, 4, 4), _where)
    tolerance = 40 if fmt == "JPEG" else 0
    assert np.abs(got[0, 0].astype(int) - pixels).max() <= tolerance


def _encode_all(frames, fmt: str) -> bytes:
    buf = io.BytesIO()
    frames[0].save(buf, format=fmt, save_all=True, append_images=frames[1:])
    return buf.getvalue()


def test_other_formats_multi_frame_images_and_other_pixel_depths_are_refused_naming_the_row():
    ok = _encode(np.zeros((4, 4), np.uint8))
    eps = _encode(np.zeros((4, 4), np.uint8), "EPS")  # opening it for decoding would start Ghostscript
    with pytest.raises(DataValidationError, match=r"Bad features at row 1: expected an image in one of PNG, JPEG, "
                                                  r"BMP, GIF, TIFF, WEBP, got EPS \(other formats are refused"):
        decode_images([ok, eps], (1, 4, 4), _where)
    with pytest.raises(DataValidationError, match=r"row 0: expected an image in one of .* got PPM"):
        decode_images([_encode(np.zeros((4, 4), np.uint8), "PPM")], (1, 4, 4), _where)
    frames = [Image.fromarray(np.full((4, 4), 60 * k, np.uint8)) for k in range(3)]
    for fmt in ("GIF", "TIFF", "PNG", "WEBP"):
        with pytest.raises(DataValidationError, match=rf"Bad features at row 1: expected a single-frame image, got a "
                                                      rf"{fmt} of 3 frames \(multi-frame images are refused, not "
                                                      rf"trained on frame 1\)"):
            decode_images([ok, _encode_all(frames, fmt)], (1, 4, 4), _where)
    as_float = _encode(np.zeros((4, 4), np.float32), "TIFF")  # Pillow mode "F"
    with pytest.raises(DataValidationError, match=r"row 0: expected 8-bit or 16-bit grayscale or colour pixels, got a "
                                                  r"TIFF of Pillow mode 'F'"):
        decode_images([as_float], (1, 4, 4), _where)


def test_a_small_file_declaring_a_huge_image_is_refused_from_its_header_without_decoding(tmp_path):
    """12000 x 12000 grayscale pixels (144 MB decoded) in a ~140 KB PNG: refused before a pixel is
    decoded (a child process measures its peak memory), its row named; a corrupt body shows the
    header is all that was read; without an input shape, ``max_pixels`` bounds the call."""
    script = tmp_path / "bomb.py"
    script.write_text(textwrap.dedent('''
        import resource, sys
        sys.path[:0] = [sys.argv[1], sys.argv[2]]
        from tests.test_images import _png, _where
        from sparkavg.data.images import decode_images
        from sparkavg.data.validation import DataValidationError
        row = bytes(12000)
        bomb = _png((12000, 12000), 8, 0, rows=(row for _ in range(12000)))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            decode_images([bomb], (1, 28, 28), lambda i: f"partition 3, row {i}")
        except DataValidationError as exc:
            print(exc)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(len(bomb), grown)
    '''))
    import sparkavg

    root = str(Path(sparkavg.__file__).parent.parent)
    out = subprocess.run([sys.executable, str(script), root, root], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    message, sizes = out.stdout.strip().splitlines()
    size, grown_kb = (int(v) for v in sizes.split())
    assert size < 1_000_000 and grown_kb < 20_000, (size, grown_kb)  # not the 144 MB it declares
    assert message == ("Bad features at partition 3, row 0: expected a 28x28 image (input shape (1, 28, 28)), got "
                       "12000x12000 (images are not resized: resize them before training)")
    header_only = _png(np.zeros((3, 3), np.uint8), 8, 0)
    cut = header_only[:33] + b"\x00\x00\x00\x05IDAT" + b"junk!" + b"\x00" * 4  # a body nobody could decode
    with pytest.raises(DataValidationError, match=r"expected a 4x4 image \(input shape \(1, 4, 4\)\), got 3x3"):
        decode_images([cut], (1, 4, 4), _where)
    limit = Image.MAX_IMAGE_PIXELS
    with pytest.raises(DataValidationError, match=r"row 0: expected an image of at most 50 pixels \(max_pixels, "
                                                  r"without an input shape\), got 10x10 = 100"):
        decode_images([_encode(np.zeros((10, 10), np.uint8))], None, _where, max_pixels=50)
    assert Image.MAX_IMAGE_PIXELS == limit, "a bound of the call, not Pillow's global"


@pytest.mark.spark
@pytest.mark.slow
def test_a_binary_column_of_png_trains_and_predicts_as_its_pixels(spark):
    """The same pixels as PNG bytes and as array<float> train the same
    parameters (decoded on the executors), the fitted model transforms and
    evaluates the PNG frame as its pixels, prepared blocks keep uint8 at the
    defaults, and an undecodable row is named by partition and row."""
    from sparkavg.data.validation import DataSpec
    from sparkavg.ml import NetworkEstimator
    from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer
    from sparkavg.spark.data import resolve_features
    from sparkavg.spark.seam import seam_for

    x, y = blobs(96, seed=51)
    u8 = np.clip(np.round(x * 40 + 128), 0, 255).astype(np.uint8)  # (96, 1, 4, 4)
    df_png = spark.createDataFrame([(i, _encode(img[0]), int(label)) for i, (img, label) in enumerate(zip(u8, y))],
                                   "id long, features binary, label long").repartition(2, "id")
    df_f32 = spark.createDataFrame([(i, img.reshape(-1).astype(float).tolist(), int(label))
                                    for i, (img, label) in enumerate(zip(u8, y))],
                                   "id long, features array<float>, label long").repartition(2, "id")
    data = DataOptions(placement="spark")

    def fit(df):
        master = ParameterAveraging(batch_size_per_worker=8, averaging_frequency=2, workers=2, data=data)
        return NetworkEstimator(network=small_net(seed=52), master=master, epochs=1).fit(df)

    png, f32 = fit(df_png), fit(df_f32)
    np.testing.assert_array_equal(png.network.params, f32.network.params)
    rows = png.transform(df_png).select("id", "probability").collect()
    ids = np.array([r["id"] for r in rows])
    np.testing.assert_allclose(np.array([r["probability"] for r in rows]), png.network.output(u8[ids].astype(np.float32)),
                               rtol=1e-5, atol=1e-6)

    with SparkTrainer(spark, png.network, ParameterAveraging(workers=2, data=data)) as trainer:
        assert trainer.evaluate(df_png).stats() == trainer.evaluate(df_f32).stats()

    seam, spec = seam_for(spark), DataSpec.of(small_net().spec)
    features = resolve_features("features", spec)
    prepared = seam.prepare(df_png, spec, 8, data, features, "label")  # the default keeps a byte a pixel
    try:
        assert set(prepared.rdd.map(lambda kv: kv[1][0]["input"].dtype.str).collect()) == {"|u1"}
    finally:
        prepared.release()
    bad = spark.createDataFrame([(0, _encode(u8[0, 0]), 1), (1, b"not an image", 0)],
                                "id long, features binary, label long").coalesce(1)
    with pytest.raises(DataValidationError, match=r"Bad features at partition 0, row 1: expected an encoded image"):
        seam.prepare(bad, spec, 8, data, features, "label")
