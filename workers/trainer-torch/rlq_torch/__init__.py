"""rlq's PyTorch trainer: loss math (algorithms), models (gpt, models), RLQB batches, safetensors I/O, the train step."""
