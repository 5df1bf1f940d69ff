"""Vision-language models (Qwen2-VL / Qwen2.5-VL style) in the torch trainer: the model's processor builds the inputs.

rlq's rollout side renders a prompt with the chat template, one placeholder per image
(``<|vision_start|><|image_pad|><|vision_end|>``), and sends the tokens with the images to the engine,
which expands each ``<|image_pad|>`` into one token per merged patch (SGLang's multimodal processor does
this from the images it loads). The batch carries those unexpanded tokens and the images' bytes.
Here the model's own processor (AutoProcessor from the model directory, the same object slime's
processing_utils.py builds) runs on the decoded prompt and the images; it gives ``pixel_values``,
``image_grid_thw`` and the expanded input ids, and those ids must equal the rollout's prompt with
each placeholder expanded by the image's grid, or the sample is refused (bad_request naming it).

Vision tokens are never trained: in the prompt they sit before the response; an image observation
inside the response (multi-turn) is expanded with loss mask 0, and the step's results are read back
at the response's own positions (``response_index``). A placeholder token the policy itself sampled
(loss mask 1) is not an image: the sample trains up to it and no further (``expand_sample``).

Without torchvision, transformers' AutoProcessor cannot build Qwen2-VL's processor (its video processor
requires torchvision, even for a request with no video); ``load_processor`` then builds the same processor
class from the directory's image processor (the PIL one) and tokenizer, with no video processor.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from .batch import Sample
from .train_config import bad_request

# transformers' names of the model classes this module trains (config.architectures[0]).
VLM_ARCHITECTURES = (
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
)


def is_vlm_dir(path: str) -> bool:
    """A HF model directory whose config names a vision tower (config.json's vision_config)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            return "vision_config" in json.load(f)
    except (OSError, ValueError):
        return False


def load_processor(model_dir: str):
    """The model's processor from its directory: AutoProcessor, or without torchvision the processor class
    that processor_config.json names, built from the image processor and tokenizer beside it (no videos)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model_dir, local_files_only=True)
    except ImportError as e:
        if "torchvision" not in str(e).lower():
            raise
        missing = e
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    try:
        with open(os.path.join(model_dir, "processor_config.json")) as f:
            name = json.load(f)["processor_class"]
    except (OSError, ValueError, KeyError) as e:
        raise bad_request(
            f"{model_dir}: AutoProcessor needs torchvision here ({missing}) and processor_config.json names no processor_class"
        ) from e
    cls = getattr(transformers, name, None)
    if cls is None:
        raise bad_request(
            f"{model_dir}: processor_class {name!r} is not a transformers class"
        )

    class ImagesOnly(cls):
        """The model's processor class with no video processor (its class needs torchvision)."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = name
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    images = AutoImageProcessor.from_pretrained(model_dir, local_files_only=True)
    return ImagesOnly(
        image_processor=images,
        tokenizer=tok,
        video_processor=None,
        chat_template=getattr(tok, "chat_template", None),
    )


def _open_image(img, where: str):
    """The image, checked against its sha256 and decoded to RGB as the processor takes it (PIL)."""
    from PIL import Image, UnidentifiedImageError

    got = hashlib.sha256(img.data).hexdigest()
    if got != img.sha256:
        raise bad_request(
            f"{where}: its bytes hash to sha256 {got}, the batch names {img.sha256}; "
            "the image is not the one the rollout used (send the bytes drawn_prompts.images names)"
        )
    try:
        with Image.open(io.BytesIO(img.data)) as im:
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise bad_request(f"{where}: not a readable image ({e})") from e


def _expand(
    ids: np.ndarray, image_token_id: int, counts: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """ids with the k-th image placeholder repeated counts[k] times, and each old position's new index."""
    reps = np.ones(ids.shape[0], dtype=np.int64)
    where = np.flatnonzero(ids == image_token_id)
    reps[where] = counts
    new_index = np.concatenate([[0], np.cumsum(reps)[:-1]])
    return np.repeat(ids, reps), new_index


def _first_difference(a: np.ndarray, b: np.ndarray) -> str:
    n = min(a.shape[0], b.shape[0])
    diff = np.flatnonzero(a[:n] != b[:n])
    if diff.size:
        k = int(diff[0])
        return f"first at position {k}: processor {int(a[k])}, rollout {int(b[k])}"
    return f"lengths {a.shape[0]} (processor) and {b.shape[0]} (rollout)"


class VisionInputs:
    """The model's processor for one model directory: expands samples into what the model's forward takes."""

    def __init__(self, processor):
        self.processor = processor
        tok = processor.tokenizer
        self.image_token_id = int(processor.image_token_id)
        self.merge = int(processor.image_processor.merge_size)
        self.tokenizer = tok
        # What a sampled image placeholder is fed as (expand_sample): any id that is not a vision token.
        self.pad_token_id = int(
            tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        )

    def expand_sample(self, s: Sample, index: int) -> Sample:
        """The sample with its image placeholders expanded and its vision inputs attached (see the module doc).

        ``index``: the sample's position in the batch, for errors."""
        where = f"sample {index} (group {s.group_index}, sample_index {s.sample_index})"
        images = s.images or []
        pl = s.prompt_length
        prompt, response = (
            s.tokens[:pl].astype(np.int64),
            s.tokens[pl:].astype(np.int64),
        )
        loss_mask = s.loss_mask
        generated = np.flatnonzero(
            (response == self.image_token_id) & (s.loss_mask != 0)
        )
        if generated.size:
            # The policy sampled the image placeholder token itself (a small or drifting model does; it
            # is an ordinary id to the engine). It is no image: the model's forward reads every
            # placeholder as one and refuses a count that does not match the images. So the sample
            # trains up to that token only: from there its loss mask is 0, and the token is fed as the
            # pad token, whose log-prob no loss reads.
            loss_mask = s.loss_mask.copy()
            loss_mask[int(generated[0]) :] = 0
            response = response.copy()
            response[generated] = self.pad_token_id
        in_prompt = int((prompt == self.image_token_id).sum())
        in_response = int((response == self.image_token_id).sum())
        if in_prompt + in_response != len(images):
            raise bad_request(
                f"{where}: {len(images)} image(s) for {in_prompt + in_response} image placeholder(s) "
                f"({in_prompt} in the prompt, {in_response} in the response)"
            )
        pil = [
            _open_image(img, f"{where} image {k} (sha256 {img.sha256})")
            for k, img in enumerate(images)
        ]
        text = self.tokenizer.decode(
            prompt.tolist(),
            skip_special_tokens=False,
            clean_up_tokenization_spaces=False,
        )
        out = self.processor(
            text=[text], images=pil[:in_prompt] or None, return_tensors="pt"
        )
        pixel_values = [out["pixel_values"]] if in_prompt else []
        grids = [out["image_grid_thw"]] if in_prompt else []
        if in_response:
            # Image observations inside the response: the processor's own image processor (the processor
            # needs text for them, and a decoded response need not re-encode to the same ids).
            obs = self.processor.image_processor(
                images=pil[in_prompt:], return_tensors="pt"
            )
            pixel_values.append(obs["pixel_values"])
            grids.append(obs["image_grid_thw"])
        grid = torch.cat(grids).to(torch.long)
        counts = [int(g.prod()) // (self.merge * self.merge) for g in grid]
        want, _ = _expand(prompt, self.image_token_id, counts[:in_prompt])
        got = out["input_ids"][0].numpy().astype(np.int64)
        if not np.array_equal(got, want):
            raise bad_request(
                f"{where}: the model's processor gives other prompt ids than the rollout used "
                f"({_first_difference(got, want)}); the rollout must tokenize with this model's tokenizer and chat template"
            )
        new_response, new_index = _expand(
            response, self.image_token_id, counts[in_prompt:]
        )
        r = new_response.shape[0]

        def spread(x: np.ndarray | None, fill) -> np.ndarray | None:
            if x is None:
                return None
            y = np.full(r, fill, dtype=x.dtype)
            y[new_index] = x
            return y

        if in_response:
            placeholders = np.flatnonzero(response == self.image_token_id)
            if np.any(loss_mask[placeholders] != 0):
                raise bad_request(
                    f"{where}: an image placeholder in the response has loss mask 1; an image observation is not the policy's output (mask it)"
                )
            # The expanded vision tokens stay out of the loss like their placeholder.
        tokens = np.concatenate([got, new_response]).astype(np.int32)
        return replace(
            s,
            tokens=tokens,
            prompt_length=int(got.shape[0]),
            loss_mask=spread(loss_mask, 0),
            rollout_log_probs=spread(s.rollout_log_probs, 0.0),
            token_versions=spread(s.token_versions, -1),
            denom_mask=spread(s.denom_mask, 0),
            teacher_log_probs=spread(s.teacher_log_probs, 0.0),
            vision={
                "pixel_values": torch.cat(pixel_values),
                "image_grid_thw": grid,
            },
            unexpanded=s,
            response_index=new_index,
        )


def expand_samples(policy, samples: list[Sample]) -> list[Sample]:
    """Every sample with images expanded (vision inputs attached); text samples as they are.
    A policy that is not a vision-language model refuses a batch with images."""
    if not any(s.images for s in samples):
        return samples
    vision = getattr(policy, "vision_inputs", None)
    if vision is None:
        raise bad_request(
            f"the batch has images and the model ({policy.describe().get('model_type')}) is not a vision-language model "
            f"the torch trainer trains ({', '.join(VLM_ARCHITECTURES)})"
        )
    return [
        vision.expand_sample(s, i) if s.images else s for i, s in enumerate(samples)
    ]


def micro_batch_vision(
    samples: list[Sample], device: torch.device
) -> dict[str, Any] | None:
    """The forward's vision kwargs for a micro-batch (the samples' images concatenated in row order), or None."""
    parts = [s.vision for s in samples if s.vision is not None]
    if not parts:
        return None
    return {
        "pixel_values": torch.cat([p["pixel_values"] for p in parts]).to(device),
        "image_grid_thw": torch.cat([p["image_grid_thw"] for p in parts]).to(device),
    }


def response_values(s: Sample, values: list[float]) -> list[float]:
    """Per-response-token values of an expanded sample at the batch's own response positions."""
    if s.response_index is None:
        return values
    return [values[int(k)] for k in s.response_index]
