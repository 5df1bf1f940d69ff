/**
 * The tokenizer of a Hugging Face model directory, read offline: remote
 * engines are sent token ids, so rlq tokenises prompts itself with the
 * model's own tokenizer.json (@huggingface/tokenizers, pure JS, no network)
 * and renders its chat template (@huggingface/jinja, the engine
 * transformers.js uses for chat templates).
 *
 * Like slime (`tokenizer.encode(prompt, add_special_tokens=False)`), `encode`
 * adds no special tokens: a chat template writes BOS and role markers itself.
 *
 * Files read from `dir`: tokenizer.json (required); tokenizer_config.json
 * (special tokens, chat_template); chat_template.jinja or chat_template.json
 * (newer layouts keep the template there); generation_config.json
 * (eos_token_id, when tokenizer_config has no eos_token).
 */

import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Tokenizer as HfTokenizerImpl } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import type { Tokenizer } from "../data/tokenizer.ts";
import { RlqError } from "../lib/errors.ts";

export interface ChatMessage {
  role: string;
  content: string;
  [key: string]: unknown;
}

export interface HfTokenizer extends Tokenizer {
  readonly bosId: number | null;
  readonly hasChatTemplate: boolean;
  /** Render the chat template (add_generation_prompt defaults to true: the prompt ends where the model answers). */
  applyChatTemplate(messages: readonly ChatMessage[], options?: { addGenerationPrompt?: boolean; tools?: unknown[]; extra?: Record<string, unknown> }): string;
  /** applyChatTemplate then encode. */
  encodeChat(messages: readonly ChatMessage[], options?: { addGenerationPrompt?: boolean; tools?: unknown[] }): number[];
}

/** The file's text, or null when it does not exist (a model without that file); any other failure is thrown. */
async function readOptionalText(path: string): Promise<string | null> {
  try {
    return await readFile(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw e;
  }
}

async function readJson(path: string): Promise<Record<string, unknown> | null> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw e;
  }
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (e) {
    throw new RlqError("tokenizer_invalid", `${path} is not valid JSON: ${(e as Error).message}`, { cause: e });
  }
}

function tokenText(t: unknown): string | null {
  if (typeof t === "string") return t;
  if (t && typeof t === "object" && typeof (t as { content?: unknown }).content === "string") return (t as { content: string }).content;
  return null;
}

export async function loadHfTokenizer(dir: string): Promise<HfTokenizer> {
  const tokenizerJson = await readJson(join(dir, "tokenizer.json"));
  if (!tokenizerJson) throw new RlqError("tokenizer_missing", `${dir}: no tokenizer.json (rlq reads Hugging Face "fast" tokenizers only)`);
  const config = (await readJson(join(dir, "tokenizer_config.json"))) ?? {};
  let impl: HfTokenizerImpl;
  try {
    impl = new HfTokenizerImpl(tokenizerJson, config);
  } catch (e) {
    throw new RlqError("tokenizer_invalid", `${dir}/tokenizer.json: ${(e as Error).message}`, { cause: e });
  }

  let template: string | null = null;
  const fromConfig = config.chat_template;
  if (typeof fromConfig === "string") template = fromConfig;
  else if (Array.isArray(fromConfig)) {
    // A list of named templates: "default" is the chat one.
    const named = fromConfig as Array<{ name?: string; template?: string }>;
    template = (named.find((t) => t.name === "default") ?? named[0])?.template ?? null;
  }
  if (template === null) template = await readOptionalText(join(dir, "chat_template.jinja"));
  if (template === null) {
    const t = (await readJson(join(dir, "chat_template.json")))?.chat_template;
    if (typeof t === "string") template = t;
  }
  const compiled = template === null ? null : new Template(template);

  const special: Record<string, string> = {};
  for (const key of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
    const t = tokenText(config[key]);
    if (t !== null) special[key] = t;
  }
  const idOf = (t: string | undefined) => (t === undefined ? undefined : impl.token_to_id(t));
  let eosId = idOf(special.eos_token);
  if (eosId === undefined) {
    const gen = await readJson(join(dir, "generation_config.json"));
    const raw = gen?.eos_token_id;
    eosId = typeof raw === "number" ? raw : Array.isArray(raw) && typeof raw[0] === "number" ? raw[0] : undefined;
  }
  if (eosId === undefined) throw new RlqError("tokenizer_invalid", `${dir}: no eos_token in tokenizer_config.json nor eos_token_id in generation_config.json`);
  const bosId = idOf(special.bos_token) ?? null;
  let vocabSize = 0;
  for (const id of impl.get_vocab(true).values()) vocabSize = Math.max(vocabSize, id + 1);

  const render = (messages: readonly ChatMessage[], options: { addGenerationPrompt?: boolean; tools?: unknown[]; extra?: Record<string, unknown> } = {}) => {
    if (compiled === null)
      throw new RlqError("tokenizer_no_chat_template", `${dir}: the tokenizer has no chat template (tokenizer_config.json chat_template, chat_template.jinja)`);
    return compiled.render({
      messages,
      add_generation_prompt: options.addGenerationPrompt ?? true,
      ...(options.tools ? { tools: options.tools } : {}),
      ...special,
      ...options.extra,
    });
  };
  const encode = (text: string) => impl.encode(text, { add_special_tokens: false }).ids;
  return {
    name: `hf:${dir}`,
    vocabSize,
    eosId,
    bosId,
    hasChatTemplate: compiled !== null,
    encode,
    decode: (ids) => impl.decode([...ids], { skip_special_tokens: false }),
    applyChatTemplate: render,
    encodeChat: (messages, options) => encode(render(messages, options)),
  };
}
