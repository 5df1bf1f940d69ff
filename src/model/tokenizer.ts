/**
 * A small tokenizer for the embedded model: a fixed list of token strings,
 * mostly single characters plus a few multi-character pieces (the demo's
 * `\boxed{` is one token, so answers stay short), matched greedily longest-first.
 * Special tokens are addressed by id and never produced by `encode`.
 */

import { z } from "zod";
import { RlqError } from "../lib/errors.ts";

export const tokenizerSpecSchema = z.object({
  /** Token strings; the index is the id. Special tokens are written as <name>. */
  tokens: z.array(z.string().min(1)).min(4),
  padId: z.number().int().nonnegative(),
  bosId: z.number().int().nonnegative(),
  eosId: z.number().int().nonnegative(),
});
export type TokenizerSpec = z.infer<typeof tokenizerSpecSchema>;

export class Tokenizer {
  readonly spec: TokenizerSpec;
  private readonly byText = new Map<string, number>();
  private readonly maxPieceLength: number;
  private readonly special: Set<number>;

  constructor(spec: TokenizerSpec) {
    this.spec = tokenizerSpecSchema.parse(spec);
    this.special = new Set([spec.padId, spec.bosId, spec.eosId]);
    spec.tokens.forEach((t, id) => {
      if (this.special.has(id)) return;
      if (this.byText.has(t)) throw new RlqError("tokenizer_invalid", `tokenizer: duplicate token ${JSON.stringify(t)}`);
      this.byText.set(t, id);
    });
    this.maxPieceLength = Math.max(...[...this.byText.keys()].map((t) => t.length));
  }

  get vocabSize(): number {
    return this.spec.tokens.length;
  }
  get bosId(): number {
    return this.spec.bosId;
  }
  get eosId(): number {
    return this.spec.eosId;
  }
  get padId(): number {
    return this.spec.padId;
  }

  /** Text → ids (no special tokens added). Throws on a character outside the vocabulary. */
  encode(text: string): number[] {
    const ids: number[] = [];
    let i = 0;
    outer: while (i < text.length) {
      for (let len = Math.min(this.maxPieceLength, text.length - i); len > 0; len--) {
        const id = this.byText.get(text.slice(i, i + len));
        if (id !== undefined) {
          ids.push(id);
          i += len;
          continue outer;
        }
      }
      throw new RlqError("tokenizer_cannot_encode", `tokenizer: character ${JSON.stringify(text[i])} at ${i} is not in the vocabulary`);
    }
    return ids;
  }

  /** Ids → text. Special tokens are dropped unless `keepSpecial`; unknown ids become U+FFFD. */
  decode(ids: Iterable<number>, opts: { keepSpecial?: boolean } = {}): string {
    let out = "";
    for (const id of ids) {
      if (this.special.has(id) && !opts.keepSpecial) continue;
      out += this.spec.tokens[id] ?? "\uFFFD";
    }
    return out;
  }

  /** The prompt format: BOS followed by the question text. */
  formatPrompt(question: string): number[] {
    return [this.bosId, ...this.encode(question)];
  }
}

/**
 * The demo vocabulary: arithmetic prompts like `37+45=` answered as `\boxed{82}`.
 * The order is part of every demo checkpoint: append, never reorder.
 */
export const DEMO_TOKENS: readonly string[] = [
  "<pad>",
  "<bos>",
  "<eos>",
  "0",
  "1",
  "2",
  "3",
  "4",
  "5",
  "6",
  "7",
  "8",
  "9",
  "+",
  "-",
  "*",
  "=",
  " ",
  "\\boxed{",
  "}",
  "(",
  ")",
  "?",
  ".",
];

export function createDemoTokenizer(): Tokenizer {
  return new Tokenizer({ tokens: [...DEMO_TOKENS], padId: 0, bosId: 1, eosId: 2 });
}
