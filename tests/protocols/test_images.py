"""openpi's image conventions: what a robot may send, and the resize, byte for byte as openpi's client library."""

from __future__ import annotations

import re

import numpy as np
import pytest
from openpi_client import image_tools

from realtime_gw.protocols.images import ImageFormatError, resize_with_pad, to_uint8_hwc


@pytest.mark.parametrize("shape", [(480, 640, 3), (240, 320, 3), (100, 200, 3), (224, 300, 3), (17, 5, 3)])
def test_resize_with_pad_is_openpis_byte_for_byte(shape: tuple[int, int, int]) -> None:
    img = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    ours = resize_with_pad(img, 224, 224)
    assert ours.shape == (224, 224, 3) and ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, image_tools.resize_with_pad(img, 224, 224))


def test_resize_keeps_a_frame_of_the_right_size_as_is() -> None:
    img = np.zeros((224, 224, 3), np.uint8)
    assert resize_with_pad(img, 224, 224) is img


def test_every_openpi_image_convention_becomes_uint8_channels_last() -> None:
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
    as_float = rng.random((3, 120, 160)).astype(np.float32)
    np.testing.assert_array_equal(to_uint8_hwc("cam", hwc, 4096), hwc)
    np.testing.assert_array_equal(to_uint8_hwc("cam", chw, 4096), hwc)  # shape[0] == 3: channels first
    # openpi's _parse_image: (255 * image).astype(np.uint8), i.e. truncated, then channels last.
    expected = (255 * as_float).astype(np.uint8).transpose(1, 2, 0)
    np.testing.assert_array_equal(to_uint8_hwc("cam", as_float, 4096), expected)
    np.testing.assert_array_equal(
        to_uint8_hwc("cam", as_float.transpose(1, 2, 0).astype(np.float64), 4096), expected
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([[1, 2, 3]], "must be an image array"),
        (np.zeros((224, 224, 3), np.int64), "must be uint8 (0..255) or float (0..1), got int64"),
        (np.zeros((224, 224), np.uint8), r"must have shape (H, W, 3) or (3, H, W), got (224, 224)"),
        (np.zeros((224, 224, 4), np.uint8), "must have shape (H, W, 3) or (3, H, W)"),
        (np.full((4, 4, 3), 255.0, np.float32), r"values in [255, 255]; float images must be in [0, 1]"),
        (np.full((4, 4, 3), np.nan, np.float32), "float images must be in [0, 1]"),
        (np.zeros((5000, 4, 3), np.uint8), "is 5000x4; each side must be between 1 and 4096"),
    ],
)
def test_images_openpi_would_not_take_are_refused_by_name(value: object, message: str) -> None:
    with pytest.raises(ImageFormatError, match=re.escape(message)) as e:
        to_uint8_hwc("observation/image", value, 4096)
    assert "'observation/image'" in str(e.value)
