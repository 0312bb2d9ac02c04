"""Encoded images in a binary column: decoded on the executors (sparkavg.data.images, Pillow)."""
from __future__ import annotations

import io

import numpy as np
import pytest

from sparkavg.data.images import decode_images, image_layout
from sparkavg.data.validation import DataValidationError

from .nets import blobs, small_net

Image = pytest.importorskip("PIL.Image", reason="Pillow is the optional extra 'images' (in the test extra)")


def _encode(pixels: np.ndarray, fmt: str = "PNG", mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, mode).save(buf, format=fmt)
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
                                                  r"JPEG, \.\.\.\), got 5 bytes Pillow cannot read \(starting b'hello'"):
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
    prepared = seam.prepare(df_png, spec, 8, data, "features", "label")  # the default keeps a byte a pixel
    try:
        assert set(prepared.rdd.map(lambda kv: kv[1][0].dtype.str).collect()) == {"|u1"}
    finally:
        prepared.release()
    bad = spark.createDataFrame([(0, _encode(u8[0, 0]), 1), (1, b"not an image", 0)],
                                "id long, features binary, label long").coalesce(1)
    with pytest.raises(DataValidationError, match=r"Bad features at partition 0, row 1: expected an encoded image"):
        seam.prepare(bad, spec, 8, data, "features", "label")
