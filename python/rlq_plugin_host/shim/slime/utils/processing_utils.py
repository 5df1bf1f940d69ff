"""slime's `encode_image_for_rollout_engine` (slime/utils/processing_utils.py), for generate
functions that build SGLang's image_data from sample.multimodal_inputs["images"].

A PIL image is encoded as slime does (RGB, PNG, base64 without a data: prefix). rlq's host hands
file paths instead of PIL images when Pillow is missing; such a file's bytes are sent as base64,
which SGLang's load_image decodes (python/sglang/srt/utils/common.py) whatever the file's name.
"""

import base64
import io


def encode_image_for_rollout_engine(image) -> str:
    if isinstance(image, str):
        with open(image, "rb") as f:
            return base64.b64encode(f.read()).decode("utf-8")
    buffer = io.BytesIO()
    if image.mode != "RGB":
        image = image.convert("RGB")
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("utf-8")
