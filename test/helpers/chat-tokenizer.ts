import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A byte-level tokenizer directory with a ChatML template (built here, never downloaded). */
export function chatTokenizerDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "rlq-chat-tpl-"));
  const vocab: Record<string, number> = {};
  for (let b = 33; b <= 126; b++) vocab[String.fromCharCode(b)] = b - 33;
  vocab["Ġ"] = 94;
  vocab["Ċ"] = 95;
  const added = ["<|im_start|>", "<|im_end|>"].map((content, i) => ({
    id: 200 + i,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  writeFileSync(
    join(dir, "tokenizer.json"),
    JSON.stringify({
      version: "1.0",
      added_tokens: added,
      normalizer: null,
      pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: true },
      post_processor: null,
      decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: true },
      model: {
        type: "BPE",
        dropout: null,
        unk_token: null,
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        vocab,
        merges: [],
      },
    }),
  );
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({
      eos_token: "<|im_end|>",
      chat_template:
        "{% if tools %}{{ 'TOOLS:' + (tools | length) | string + '\\n' }}{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}{% if enable_thinking is defined and not enable_thinking %}{{ '<think></think>' }}{% endif %}",
    }),
  );
  return dir;
}

/**
 * chatTokenizerDir with a vision-language template: a content part list renders each image part
 * as Qwen2-VL's placeholder (<|vision_start|><|image_pad|><|vision_end|>), text parts as their text.
 */
export function visionChatTokenizerDir(): string {
  const dir = chatTokenizerDir();
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({
      eos_token: "<|im_end|>",
      chat_template:
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    }),
  );
  return dir;
}
