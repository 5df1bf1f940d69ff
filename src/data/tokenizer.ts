/**
 * Tokenizers rlq needs on its own side (prompts into ids, responses into
 * text for `rollout_history`). `bytes`: UTF-8 bytes 0..255 plus BOS=256,
 * EOS=257 — what the test engines and simple remote setups speak.
 */
export interface Tokenizer {
  readonly name: string;
  readonly vocabSize: number;
  readonly eosId: number;
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
}

export function createByteTokenizer(): Tokenizer {
  const BOS = 256;
  const EOS = 257;
  const encoder = new TextEncoder();
  const decoder = new TextDecoder("utf-8", { fatal: false });
  return {
    name: "bytes",
    vocabSize: 258,
    eosId: EOS,
    encode: (text) => [BOS, ...encoder.encode(text)],
    decode: (ids) => decoder.decode(Uint8Array.from(ids.filter((i) => i < 256))),
  };
}
