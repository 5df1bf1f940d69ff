"""Write a tiny, randomly initialised Qwen2-VL model directory: the trainer's vision-language tests use it.

    .venv/bin/python scripts/make-tiny-vlm.py OUT_DIR [--seed 0] [--arch qwen2_vl|qwen2_5_vl]

What it writes, deterministically from the seed, never downloading anything:
- a byte-level BPE tokenizer (the 256 byte symbols, no merges) with Qwen2-VL's special tokens
  (`<|im_start|>`, `<|im_end|>`, `<|vision_start|>`, `<|image_pad|>`, `<|vision_end|>`, ...) and a
  ChatML chat template whose content parts render an image part as
  `<|vision_start|><|image_pad|><|vision_end|>`, as Qwen2-VL's own template does;
- the model's processor (processor_config.json, preprocessor_config.json): Qwen2-VL's image
  processor with small pixel bounds, so a test image is a handful of patches;
- a Qwen2VLForConditionalGeneration (or Qwen2_5_VLForConditionalGeneration) with a 2-layer text model of width 32
  and a 1-block vision tower, saved as model.safetensors beside config.json.

The whole directory is a few hundred KiB and takes about a second to write.
"""

import argparse
import json
import os
import sys

# Qwen2-VL's template, cut to the parts rlq's prompts use: string or content-part turns, images as placeholders.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' or 'image' in c %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
VOCAB_SIZE = 272  # 256 byte symbols + the specials, rounded up to a multiple of 16
# One image patch is 14 px, merged 2x2 into one token: 28x28 px per vision token. An image is resized
# (smart_resize) to a multiple of 28 with between 2x2 and 4x4 vision tokens' worth of pixels.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112


def byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table (the ByteLevel pre-tokenizer's alphabet), in byte order."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def tokenizer_json() -> dict:
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    added = [
        {
            "id": 256 + i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(SPECIALS)
    ]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def special_id(token: str) -> int:
    return 256 + SPECIALS.index(token)


def model_config(arch: str) -> dict:
    text = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        # head_dim 8: mrope splits its 4 rotary frequencies into (temporal, height, width) sections.
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 1, 1],
        },
        tie_word_embeddings=False,
        bos_token_id=special_id("<|endoftext|>"),
        eos_token_id=special_id("<|im_end|>"),
        pad_token_id=special_id("<|endoftext|>"),
    )
    vision = dict(
        depth=1,
        num_heads=2,
        in_channels=3,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    if arch == "qwen2_vl":
        vision.update(embed_dim=32, hidden_size=32, mlp_ratio=2)
    else:
        vision.update(
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=32,
            window_size=56,
            fullatt_block_indexes=[0],
        )
    return dict(
        text_config=text,
        vision_config=vision,
        image_token_id=special_id("<|image_pad|>"),
        video_token_id=special_id("<|video_pad|>"),
        vision_start_token_id=special_id("<|vision_start|>"),
        vision_end_token_id=special_id("<|vision_end|>"),
        bos_token_id=special_id("<|endoftext|>"),
        eos_token_id=special_id("<|im_end|>"),
        pad_token_id=special_id("<|endoftext|>"),
        tie_word_embeddings=False,
    )


def write_tiny_vlm(out_dir: str, seed: int = 0, arch: str = "qwen2_vl") -> str:
    """Write the model directory; returns it. The tests call this directly (no subprocess)."""
    import torch
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(out_dir, "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
        },
    )
    tok.chat_template = CHAT_TEMPLATE
    if arch == "qwen2_vl":
        from transformers import (
            Qwen2VLConfig as Config,
        )
        from transformers import (
            Qwen2VLForConditionalGeneration as Model,
        )

        processor_class = "Qwen2VLProcessor"
    elif arch == "qwen2_5_vl":
        from transformers import (
            Qwen2_5_VLConfig as Config,
        )
        from transformers import (
            Qwen2_5_VLForConditionalGeneration as Model,
        )

        processor_class = "Qwen2_5_VLProcessor"
    else:
        raise ValueError(f"--arch {arch!r}: expected qwen2_vl or qwen2_5_vl")
    # The processor's parts are written one by one, as Qwen2VLProcessor.save_pretrained lays them out:
    # the processor itself cannot be built here without torchvision (its video processor needs it,
    # rlq_torch/vlm.py load_processor), and the PIL image processor stands in for the fast one.
    from transformers import Qwen2VLImageProcessorPil

    tok.save_pretrained(out_dir)
    Qwen2VLImageProcessorPil(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    ).save_pretrained(out_dir)
    with open(os.path.join(out_dir, "processor_config.json"), "w") as f:
        json.dump({"processor_class": processor_class}, f, indent=2)
    cfg = Config(**model_config(arch))
    torch.manual_seed(seed)
    model = Model(cfg).to(torch.float32)
    model.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", default="qwen2_vl", choices=["qwen2_vl", "qwen2_5_vl"])
    a = ap.parse_args()
    print(write_tiny_vlm(a.out_dir, a.seed, a.arch))


if __name__ == "__main__":
    sys.exit(main())
