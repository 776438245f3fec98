"""Real pictures for the image models' INT8 checks: scikit-image ships them in its wheel
(``skimage.data``: photos, a scanned page, text), so they load offline. Cut and normalized
as the PP-OCR models take them."""

from __future__ import annotations

import numpy as np

# pictures the build calibrates on (its held-out split is cut from them too) and pictures it
# never sees; text in both (scikit-image's "text" and a scanned "page")
CALIBRATION_PICTURES = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins",
                        "brick", "text", "immunohistochemistry", "moon", "grass",
                        "colorwheel")
UNSEEN_PICTURES = ("page", "hubble_deep_field", "cell", "clock", "gravel", "retina")


def ppocr_pictures(names: tuple[str, ...], size: int, per_picture: int) -> np.ndarray:
    """``per_picture`` crops of ``size`` x ``size`` along each picture's diagonal (scaled so
    its short side is ``1.5 * size``), as PP-OCR feeds them: BGR, (x / 255 - 0.5) / 0.5,
    NCHW float32."""
    import skimage.data
    from PIL import Image

    crops = []
    for name in names:
        picture = np.asarray(getattr(skimage.data, name)())
        if picture.dtype == np.bool_:
            picture = picture.astype(np.uint8) * 255
        if picture.ndim == 2:
            picture = np.stack([picture] * 3, axis=-1)
        image = Image.fromarray(picture[..., :3].astype(np.uint8))
        scale = 1.5 * size / min(image.size)
        image = image.resize((max(size, round(image.size[0] * scale)),
                              max(size, round(image.size[1] * scale))))
        array = (np.asarray(image, np.float32)[..., ::-1] / 255.0 - 0.5) / 0.5
        height, width = array.shape[:2]
        for k in range(per_picture):
            y = (height - size) * k // max(1, per_picture - 1)
            x = (width - size) * k // max(1, per_picture - 1)
            crops.append(array[y:y + size, x:x + size].transpose(2, 0, 1))
    return np.ascontiguousarray(np.stack(crops))
