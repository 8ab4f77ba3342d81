"""Plan-file preprocessing functions against Pillow + numpy, through a real producer;
bad rows, and reproducible random augmentations.

Tolerances (docs/functions.md): PNG decode, center crop and to_chw identical; resize at
most 1 level from Pillow's BILINEAR; JPEG decode (another decoder than libjpeg) mean
absolute difference below 1.5 levels; normalize within 1e-5.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import sluice

SIZES = [(40, 30), (64, 48), (33, 71), (100, 100), (57, 90), (48, 48)]


def picture(w: int, h: int, seed: int) -> Image.Image:
    """A deterministic RGB picture: gradients, a disc and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1)).astype(np.uint8)
    g = (y * 255 // max(h - 1, 1)).astype(np.uint8)
    b = rng.integers(0, 256, size=(h, w), dtype=np.uint8)
    disc = (x - w // 2) ** 2 + (y - h // 3) ** 2 < (min(w, h) // 4) ** 2
    r[disc] = 230
    return Image.fromarray(np.dstack([r, g, b]), "RGB")


def encoded(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def image_table(tmp_path: Path, fmt: str) -> tuple[Path, list[bytes]]:
    blobs = [encoded(picture(w, h, i), fmt) for i, (w, h) in enumerate(SIZES)]
    d = tmp_path / f"images-{fmt}"
    d.mkdir()
    pq.write_table(
        pa.table({"id": pa.array(range(len(blobs)), pa.int64()), "image": pa.array(blobs, pa.binary())}),
        d / "part-0.parquet",
    )
    return d, blobs


def write_plan(tmp_path: Path, topic: str, data: Path, select: str, sets: str = "") -> Path:
    plan = tmp_path / "plan.sql"
    plan.write_text(
        f"SET sluice.topic = '{topic}';\nSET sluice.batch_rows = 4;\n{sets}"
        f"CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{data}/';\n{select};\n"
    )
    return plan


def run_epochs(tmp_path: Path, topic: str, data: Path, select: str, sets: str = "") -> list[pa.Table]:
    """Runs the plan through a real producer and one subscriber: one table per epoch, by id."""
    epochs = []
    with sluice.Producer(write_plan(tmp_path, topic, data, select, sets), min_subscribers=1) as producer:
        with sluice.subscribe(topic, timeout=60) as sub:
            for epoch in sub.epochs():
                batches = [pa.record_batch(b) for b in epoch]
                # sort_by copies out of shared memory; the views go before the next epoch
                # (a subscriber may hold only sluice.max_held batches at once).
                epochs.append(pa.Table.from_batches(batches).combine_chunks().sort_by("id"))
                del batches
        producer.wait(timeout=60)
    return epochs


def run_plan(tmp_path: Path, topic: str, data: Path, select: str) -> pa.Table:
    [table] = run_epochs(tmp_path, topic, data, select)
    return table


def tensors(table: pa.Table, column: str) -> np.ndarray:
    col = table.column(column).combine_chunks()
    assert isinstance(col.type, pa.FixedShapeTensorType), col.type
    return col.to_numpy_ndarray()


def decoded(table: pa.Table, i: int) -> np.ndarray:
    img = table.column("img")[i]
    h, w, c = img["height"].as_py(), img["width"].as_py(), img["channels"].as_py()
    return np.frombuffer(img["data"].as_py(), np.uint8).reshape(h, w, c)


def test_decode_png_is_identical_to_pillow(tmp_path, topic, ns):
    data, blobs = image_table(tmp_path, "PNG")
    table = run_plan(tmp_path, topic, data, "SELECT id, decode_image(image) AS img FROM t")
    for i, blob in enumerate(blobs):
        want = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))
        np.testing.assert_array_equal(decoded(table, i), want)


def test_decode_jpeg_is_close_to_pillow(tmp_path, topic, ns):
    data, blobs = image_table(tmp_path, "JPEG")
    table = run_plan(tmp_path, topic, data, "SELECT id, decode_image(image) AS img FROM t")
    for i, blob in enumerate(blobs):
        want = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB")).astype(np.int16)
        got = decoded(table, i).astype(np.int16)
        assert got.shape == want.shape
        diff = np.abs(got - want)
        assert diff.mean() < 1.5, (i, diff.mean(), diff.max())


def test_resize_normalize_and_chw_match_pillow_and_numpy(tmp_path, topic, ns):
    data, blobs = image_table(tmp_path, "PNG")
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    table = run_plan(
        tmp_path, topic, data,
        "SELECT id, resize(decode_image(image), 24, 32) AS small, "
        "to_chw(normalize(resize(decode_image(image), 24, 32), "
        "make_array(0.485, 0.456, 0.406), make_array(0.229, 0.224, 0.225))) AS x, "
        "center_crop(decode_image(image), 20, 16) AS mid FROM t",
    )
    small, x, mid = tensors(table, "small"), tensors(table, "x"), tensors(table, "mid")
    assert small.shape == (len(blobs), 24, 32, 3) and small.dtype == np.uint8
    assert x.shape == (len(blobs), 3, 24, 32) and x.dtype == np.float32
    for i, blob in enumerate(blobs):
        img = Image.open(io.BytesIO(blob)).convert("RGB")
        want = np.asarray(img.resize((32, 24), Image.Resampling.BILINEAR))
        assert np.abs(small[i].astype(np.int16) - want).max() <= 1, i
        # normalize and to_chw against numpy on the very pixels Sluice resized.
        ref = ((small[i].astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)
        np.testing.assert_allclose(x[i], ref, atol=1e-5)
        w, h = img.size
        top, left = (h - 20) // 2, (w - 16) // 2
        np.testing.assert_array_equal(mid[i], np.asarray(img)[top:top + 20, left:left + 16])


def test_random_crop_is_a_window_of_the_image(tmp_path, topic, ns):
    data, blobs = image_table(tmp_path, "PNG")
    table = run_plan(
        tmp_path, topic, data,
        "SELECT id, random_crop(decode_image(image), 24, 24, id) AS crop FROM t",
    )
    crops = tensors(table, "crop")
    for i, blob in enumerate(blobs):
        img = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))
        h, w, _ = img.shape
        found = [(t, l) for t in range(h - 23) for l in range(w - 23)
                 if np.array_equal(img[t:t + 24, l:l + 24], crops[i])]
        assert found, f"row {i}: the crop is not a window of the image"


def bad_image_table(tmp_path: Path) -> Path:
    """Rows 0 and 2 are PNGs; row 1 is bytes that are no image."""
    blobs = [encoded(picture(20, 10, 0), "PNG"), b"not an image at all", encoded(picture(9, 12, 2), "PNG")]
    d = tmp_path / "bad-images"
    d.mkdir()
    pq.write_table(
        pa.table({"id": pa.array(range(3), pa.int64()), "image": pa.array(blobs, pa.binary())}),
        d / "part-0.parquet",
    )
    return d


def test_an_undecodable_image_fails_the_producer_naming_function_and_row(tmp_path, topic, ns):
    data = bad_image_table(tmp_path)
    plan = write_plan(tmp_path, topic, data, "SELECT id, decode_image(image) AS img FROM t")
    producer = sluice.Producer(plan, min_subscribers=1)
    try:
        with sluice.subscribe(topic, timeout=60) as sub:
            with pytest.raises(sluice.ProducerFailed, match=r"decode_image: row 1 of a batch of 3: cannot decode"):
                for batch in sub:
                    del batch
        with pytest.raises(sluice.SluiceError, match="try_decode_image"):
            producer.wait(timeout=60)
    finally:
        # close() raises the run's error again; it is the one checked above.
        with contextlib.suppress(sluice.SluiceError):
            producer.close()


def test_try_decode_image_gives_null_for_an_undecodable_image(tmp_path, topic, ns):
    data = bad_image_table(tmp_path)
    table = run_plan(tmp_path, topic, data, "SELECT id, try_decode_image(image) AS img FROM t")
    assert table.column("img").is_null().to_pylist() == [False, True, False]
    assert decoded(table, 2).shape == (12, 9, 3)


def test_random_augmentations_repeat_for_a_seed_and_differ_between_epochs(tmp_path, topic, ns):
    data, _ = image_table(tmp_path, "PNG")
    select = "SELECT id, random_flip(random_crop(resize(decode_image(image), 40, 40), 24, 24, id), id) AS x FROM t"
    sets = "SET sluice.epochs = 2;\nSET sluice.shuffle_seed = 11;\n"
    first = [tensors(t, "x") for t in run_epochs(tmp_path, topic, data, select, sets)]
    again = [tensors(t, "x") for t in run_epochs(tmp_path, topic, data, select, sets)]
    other = [tensors(t, "x") for t in run_epochs(tmp_path, topic, data, select, sets.replace("11", "12"))]
    assert len(first) == 2
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1]), "epochs 0 and 1 gave the same augmentations"
    assert not np.array_equal(first[0], other[0]), "seeds 11 and 12 gave the same augmentations"
