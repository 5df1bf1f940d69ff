import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadHfTokenizer } from "./hf-tokenizer.ts";

// GPT-2's byte → printable-character map, used by byte-level BPE tokenizers (Qwen, Llama 3).
function bytesToUnicode(): string[] {
  const keep = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const out: string[] = [];
  let n = 0;
  for (let b = 0; b < 256; b++) out.push(String.fromCharCode(keep(b) ? b : 256 + n++));
  return out;
}

/** A small byte-level BPE tokenizer directory in the Qwen layout, built here rather than downloaded. */
function fixtureDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "rlq-hf-tok-"));
  const chars = bytesToUnicode();
  const vocab: Record<string, number> = {};
  chars.forEach((c, i) => (vocab[c] = i));
  const merges = [
    ["h", "e"],
    ["l", "l"],
    ["he", "ll"],
    ["hell", "o"],
    ["Ġ", "w"],
  ];
  for (const [a, b] of merges) vocab[`${a}${b}`] = Object.keys(vocab).length;
  const specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
  const added = specials.map((content, i) => ({ id: 300 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  writeFileSync(
    join(dir, "tokenizer.json"),
    JSON.stringify({
      version: "1.0",
      truncation: null,
      padding: null,
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
        merges: merges.map(([a, b]) => `${a} ${b}`),
      },
    }),
  );
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({
      eos_token: "<|im_end|>",
      pad_token: "<|endoftext|>",
      chat_template:
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    }),
  );
  return dir;
}

describe("Hugging Face tokenizer from a local directory", () => {
  it("encodes without special tokens, decodes back, and knows EOS", async () => {
    const tok = await loadHfTokenizer(fixtureDir());
    const ids = tok.encode("hello world");
    expect(ids.slice(0, 2)).toEqual([259, 260]); // "hello", "Ġw"
    expect(tok.decode(ids)).toBe("hello world");
    expect(tok.eosId).toBe(302);
    expect(tok.vocabSize).toBe(303);
  });

  it("renders the chat template with the generation prompt and encodes special tokens as single ids", async () => {
    const tok = await loadHfTokenizer(fixtureDir());
    const text = tok.applyChatTemplate([{ role: "user", content: "hello" }]);
    expect(text).toBe("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n");
    const ids = tok.encodeChat([{ role: "user", content: "hello" }]);
    expect(ids[0]).toBe(301);
    expect(ids.filter((i) => i === 302)).toHaveLength(1);
    expect(tok.decode(ids)).toBe(text);
  });

  it("names the missing file", async () => {
    await expect(loadHfTokenizer(mkdtempSync(join(tmpdir(), "rlq-hf-empty-")))).rejects.toMatchObject({ code: "tokenizer_missing" });
  });
});
