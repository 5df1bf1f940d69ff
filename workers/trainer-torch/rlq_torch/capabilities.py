"""What this trainer can do, answered in /v1/health ``capabilities`` (rlq reads it before a run trains)."""

from __future__ import annotations

from typing import Any


def capabilities(world_size: int = 1) -> dict[str, Any]:
    from .dist import fsdp2_available

    return {
        "critic": True,  # advantage_estimator: ppo (critic.py; embedded and HF models); rlq refuses ppo when this is false
        "sequence_packing": True,  # use_dynamic_batch_size with max_tokens_per_gpu (embedded and HF models; a HF model that cannot pack: bad_request)
        "gradient_checkpointing": True,
        # Batches with images, on Qwen2-VL-style HF models and one rank (vlm.py).
        "images": world_size == 1,
        "lora": True,  # lora_rank > 0 on a Hugging Face model (lora.py)
        "hf_save_dtype": ["bf16", "fp16", "fp32"],
        "world_size": world_size,
        "data_parallel": "ddp+sharded_optimizer" if world_size > 1 else None,
        "fsdp2_available": fsdp2_available(),
    }
