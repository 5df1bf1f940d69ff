/**
 * From a dataset record to the prompt text, as slime's `Dataset`
 * (`slime/utils/data.py`) does it, for every dataset format (JSONL, Parquet):
 *
 * - `input_key` holds a string or a message list (`[{role, content}, ...]`).
 * - `apply_chat_template: false`: a string is the prompt as is; a message list
 *   is an error (rlq sends token ids, so the prompt must become text somewhere).
 * - `apply_chat_template: true`: a string becomes `[{role: "user", content}]`,
 *   then the local Hugging Face tokenizer's chat template renders it with
 *   `add_generation_prompt: true`, the row's tools (`tool_key`, a list or a
 *   JSON string of one) and `apply_chat_template_kwargs`.
 *
 * Also `rollout_max_prompt_len`: slime drops prompts longer than it at load
 * time (`filter_long_prompt`), counted with the tokenizer the engine is fed.
 */

import { dirname, resolve as resolvePath } from "node:path";
import { z } from "zod";
import type { ChatMessage, HfTokenizer } from "../engines/hf-tokenizer.ts";
import { RlqError } from "../lib/errors.ts";
import type { Dataset, DatasetKeys, PromptRow } from "./prompt-row.ts";
import { loadRecordImages, type MultimodalKeys, type PromptImage } from "./images.ts";
import { conversationLabel, firstAssistantTurn, type SftConversation } from "./sft-conversation.ts";

/** One chat message as a dataset may hold it; extra keys (tool_calls, name, ...) reach the template. */
export const chatMessageSchema = z.looseObject({ role: z.string().min(1), content: z.string() });
export const chatMessagesSchema = z.array(chatMessageSchema).min(1);

/** What rendering needs of a tokenizer: `HfTokenizer` from src/engines/hf-tokenizer.ts satisfies it. */
export type ChatTemplateRenderer = Pick<HfTokenizer, "applyChatTemplate">;

export interface PromptRenderOptions {
  /** slime --apply-chat-template. Default false. */
  applyChatTemplate?: boolean;
  /** Required when applyChatTemplate: the tokenizer directory's template (`loadHfTokenizer(dir)`). */
  chatTemplate?: ChatTemplateRenderer | null;
  /** slime --apply-chat-template-kwargs: extra template variables (e.g. `enable_thinking: false`). */
  chatTemplateKwargs?: Record<string, unknown>;
  /** slime --multimodal-keys (media type → record key); needs applyChatTemplate. See images.ts. */
  multimodalKeys?: MultimodalKeys | null;
  /** The dataset file's directory: relative image paths are read from here. */
  imageBaseDir?: string;
  /** Content-addressed directory for inline (data URI, bytes) images. */
  imageStoreDir?: string | null;
  /**
   * An SFT run (loss_type sft_loss): with applyChatTemplate, a row whose turns include assistant turns is
   * a conversation to train on (src/data/sft-conversation.ts), its label the conversation's JSON.
   */
  sftConversations?: boolean;
}

/** Dataset keys plus slime's `tool_key` (default `tools`). */
export interface PromptRecordKeys extends DatasetKeys {
  tool_key?: string;
}

export type Decoded<T> = { ok: true; value: T } | { ok: false; error: string };

function show(v: unknown): string {
  const s = JSON.stringify(v, (_k, x: unknown) => (typeof x === "bigint" ? x.toString() : x)) ?? String(v);
  return s.length > 120 ? `${s.slice(0, 120)}…` : s;
}

/**
 * The prompt text of one record's `input_key` value (and its tools). Never
 * throws for bad data: returns the reason, which the loader prefixes with the
 * line or row number.
 */
export function renderPromptInput(
  value: unknown,
  tools: unknown,
  keys: PromptRecordKeys,
  options: PromptRenderOptions = {},
  imageTypes: readonly string[] | null = null,
): Decoded<string> {
  const toolKey = keys.tool_key ?? "tools";
  if (!options.applyChatTemplate) {
    if (typeof value === "string" && value.length > 0) return { ok: true, value };
    if (Array.isArray(value))
      return {
        ok: false,
        error: `input_key '${keys.input_key}' is a message list; set apply_chat_template: true (with hf_checkpoint naming a tokenizer directory) to render it`,
      };
    return { ok: false, error: `input_key '${keys.input_key}' must be a non-empty string, got ${show(value) ?? "nothing"}` };
  }
  if (!options.chatTemplate) throw new RlqError("config_invalid", "apply_chat_template: true needs a tokenizer with a chat template (hf_checkpoint)");
  let messages: ChatMessage[];
  if (imageTypes !== null) {
    // slime's Dataset (slime/utils/data.py): with multimodal_keys the user turn's content is a
    // part list, the text first then one part per image; the template renders each image part as
    // the model's placeholder (Qwen2-VL: <|vision_start|><|image_pad|><|vision_end|>).
    if (typeof value !== "string" || value.length === 0)
      return {
        ok: false,
        error: `input_key '${keys.input_key}' must be a non-empty string when multimodal_keys is set (slime wraps it as the user turn), got ${show(value)}`,
      };
    const parts = [{ type: "text", text: value }, ...imageTypes.map((type) => ({ type }))];
    messages = [{ role: "user", content: parts as unknown as string }];
  } else if (typeof value === "string" && value.length > 0) messages = [{ role: "user", content: value }];
  else {
    const parsed = chatMessagesSchema.safeParse(value);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      const at = issue ? `${issue.path.join(".") || "(value)"}: ${issue.message}` : "invalid";
      return { ok: false, error: `input_key '${keys.input_key}' must be a string or a non-empty list of {role, content} messages (${at}), got ${show(value)}` };
    }
    messages = parsed.data;
  }
  const parsedTools = toolsOf(tools, toolKey);
  if (!parsedTools.ok) return parsedTools;
  const toolList = parsedTools.value;
  try {
    const rendered = options.chatTemplate.applyChatTemplate(messages, {
      addGenerationPrompt: true,
      ...(toolList ? { tools: toolList } : {}),
      ...(options.chatTemplateKwargs ? { extra: options.chatTemplateKwargs } : {}),
    });
    return { ok: true, value: rendered };
  } catch (e) {
    if (e instanceof RlqError) throw e; // no template at all: a config error, not a row error
    return { ok: false, error: `chat template failed: ${(e as Error).message}` };
  }
}

/** A row's tools (`tool_key`): a list of tool specs or the JSON of one; undefined when the row has none. */
function toolsOf(tools: unknown, toolKey: string): Decoded<unknown[] | undefined> {
  if (tools === undefined || tools === null) return { ok: true, value: undefined };
  let t = tools;
  if (typeof t === "string") {
    try {
      t = JSON.parse(t);
    } catch {
      return { ok: false, error: `tool_key '${toolKey}' is a string that is not JSON: ${show(tools)}` };
    }
  }
  if (!Array.isArray(t)) return { ok: false, error: `tool_key '${toolKey}' must be a list of tool specs (or its JSON), got ${show(tools)}` };
  return { ok: true, value: t as unknown[] };
}

/**
 * An SFT conversation row (sftConversations; src/data/sft-conversation.ts): `input_key` holds the whole
 * conversation, assistant turns included (slime's SFT format), or the prompt (text or turns) with
 * `label_key` holding the turns that follow it. Null for a row whose response is text.
 */
function sftConversationOf(
  input: unknown,
  label: unknown,
  tools: unknown,
  keys: PromptRecordKeys,
): Decoded<{ prompt: ChatMessage[]; conversation: SftConversation } | null> {
  const turns = (v: unknown, key: string): Decoded<ChatMessage[]> => {
    const parsed = chatMessagesSchema.safeParse(v);
    if (parsed.success) return { ok: true, value: parsed.data };
    const issue = parsed.error.issues[0];
    return {
      ok: false,
      error: `${key} must be a non-empty list of {role, content} messages (${issue ? `${issue.path.join(".") || "(value)"}: ${issue.message}` : "invalid"}), got ${show(v)}`,
    };
  };
  let messages: ChatMessage[];
  if (Array.isArray(input) && input.some((m) => (m as { role?: unknown } | null)?.role === "assistant")) {
    const all = turns(input, `input_key '${keys.input_key}'`);
    if (!all.ok) return all;
    messages = all.value;
  } else if (Array.isArray(label)) {
    const prompt =
      typeof input === "string" && input.length > 0
        ? { ok: true as const, value: [{ role: "user", content: input }] }
        : turns(input, `input_key '${keys.input_key}'`);
    if (!prompt.ok) return prompt;
    const rest = turns(label, `label_key '${keys.label_key}'`);
    if (!rest.ok) return rest;
    if (firstAssistantTurn(rest.value) < 0)
      return { ok: false, error: `label_key '${keys.label_key}' holds no assistant turn to train on: add {"role": "assistant", "content": ...}` };
    messages = [...prompt.value, ...rest.value];
  } else return { ok: true, value: null };
  const first = firstAssistantTurn(messages);
  if (first === 0)
    return { ok: false, error: `input_key '${keys.input_key}': the conversation starts with an assistant turn: put a user (or system) turn before it` };
  const toolList = toolsOf(tools, keys.tool_key ?? "tools");
  if (!toolList.ok) return toolList;
  return { ok: true, value: { prompt: messages.slice(0, first), conversation: { messages, ...(toolList.value ? { tools: toolList.value } : {}) } } };
}

/** BigInt (Parquet INT64) → number when safe, else its decimal string; recursively. */
export function plainJson(value: unknown): unknown {
  if (typeof value === "bigint") return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  if (Array.isArray(value)) return value.map(plainJson);
  if (value instanceof Date) return value.toISOString();
  if (value !== null && typeof value === "object" && !(value instanceof Uint8Array)) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plainJson(v)]));
  }
  return value;
}

/**
 * One dataset record → a PromptRow (without its index), the same rules as
 * dataset.ts's JSONL loader plus message lists and tools. `lineOrRow` is the
 * 1-based line (JSONL) or row (Parquet) number stored in `PromptRow.line`.
 * Metadata may be an object or a JSON string of one (Parquet files written
 * from pandas often hold it that way).
 */
export function promptRowFromRecord(
  record: Record<string, unknown>,
  lineOrRow: number,
  keys: PromptRecordKeys,
  options: PromptRenderOptions = {},
): Decoded<Omit<PromptRow, "index">> {
  const rec = plainJson(record) as Record<string, unknown>;
  const mm = options.multimodalKeys && Object.keys(options.multimodalKeys).length > 0 ? options.multimodalKeys : null;
  let images: PromptImage[] | null = null;
  if (mm !== null) {
    if (!options.applyChatTemplate)
      throw new RlqError("config_invalid", "multimodal_keys needs apply_chat_template: true (the chat template puts the image placeholders in the prompt)");
    const loaded = loadRecordImages(rec, mm, { baseDir: options.imageBaseDir ?? ".", imageStoreDir: options.imageStoreDir ?? null });
    if (!loaded.ok) return loaded;
    images = loaded.value;
  }
  const rawLabel = keys.label_key === null ? undefined : rec[keys.label_key];
  const tools = rec[keys.tool_key ?? "tools"];
  const sft = options.sftConversations && options.applyChatTemplate && mm === null ? sftConversationOf(rec[keys.input_key], rawLabel, tools, keys) : null;
  if (sft !== null && !sft.ok) return sft;
  const conversation = sft?.value ?? null;
  const prompt = renderPromptInput(conversation?.prompt ?? rec[keys.input_key], tools, keys, options, images?.map((i) => i.type) ?? null);
  if (!prompt.ok) return prompt;
  const label =
    conversation !== null
      ? conversationLabel(conversation.conversation)
      : rawLabel === undefined || rawLabel === null
        ? null
        : typeof rawLabel === "string"
          ? rawLabel
          : JSON.stringify(rawLabel);
  let meta = rec[keys.metadata_key];
  if (typeof meta === "string") {
    try {
      meta = JSON.parse(meta);
    } catch {
      return { ok: false, error: `metadata_key '${keys.metadata_key}' must be an object (or a JSON string of one), got ${show(meta)}` };
    }
  }
  if (meta !== undefined && meta !== null && (typeof meta !== "object" || Array.isArray(meta))) {
    return { ok: false, error: `metadata_key '${keys.metadata_key}' must be an object, got ${show(meta)}` };
  }
  const metadata = (meta as Record<string, unknown> | null | undefined) ?? {};
  return { ok: true, value: { line: lineOrRow, prompt: prompt.value, label, metadata, ...(images !== null ? { images } : {}) } };
}

/** What `filterLongPrompts` removed, for the run's dataset report. */
export interface LongPromptReport {
  maxPromptLen: number;
  /** How many rows were dropped. */
  filtered: number;
  /** Their line/row numbers and token counts (first 20). */
  examples: Array<{ line: number; tokens: number }>;
}

/**
 * slime `filter_long_prompt`: drop rows whose prompt is longer than
 * `maxPromptLen` tokens, counted by `countTokens` (pass the run tokenizer's
 * `encode(p).length`: the ids the engine is actually sent, BOS included for
 * the demo tokenizer). Rows are re-indexed, since the cursor permutes valid
 * row indices; the fingerprint stays the file's. All rows too long is a
 * `dataset_empty` error.
 */
export function filterLongPrompts(
  dataset: Dataset,
  countTokens: (prompt: string) => number,
  maxPromptLen: number | null,
  names: { dataset: string; bound: string } = { dataset: "prompt_data", bound: "rollout_max_prompt_len" },
): { dataset: Dataset; report: LongPromptReport | null } {
  if (maxPromptLen === null) return { dataset, report: null };
  const kept: PromptRow[] = [];
  const report: LongPromptReport = { maxPromptLen, filtered: 0, examples: [] };
  for (const row of dataset.rows) {
    const n = countTokens(row.prompt);
    if (n > maxPromptLen) {
      report.filtered++;
      if (report.examples.length < 20) report.examples.push({ line: row.line, tokens: n });
      continue;
    }
    kept.push({ ...row, index: kept.length });
  }
  if (kept.length === 0) {
    throw new RlqError(
      "dataset_empty",
      `${names.dataset} ${dataset.path}: every one of ${dataset.rows.length} prompts is longer than ${names.bound} ${maxPromptLen}`,
    );
  }
  return { dataset: { ...dataset, rows: kept }, report };
}

/** Options with the dataset file's directory as the base of relative image paths (unless set). */
export function withImageDir<T extends PromptRenderOptions>(datasetPath: string, options: T): T {
  return options.imageBaseDir !== undefined ? options : { ...options, imageBaseDir: dirname(resolvePath(datasetPath)) };
}

/**
 * The text the chat template renders for one image content part (Qwen2-VL:
 * `<|vision_start|><|image_pad|><|vision_end|>`): the difference between a user turn
 * `[text, image]` and the same turn without the image, as the prompt's placeholders are made
 * (`renderPromptInput`). Null when the template renders no image part (a text-only model's).
 */
export function imagePlaceholderOf(renderer: ChatTemplateRenderer): string | null {
  const marker = "\u0001rlq\u0001";
  const render = (parts: Array<Record<string, string>>) =>
    renderer.applyChatTemplate([{ role: "user", content: parts as unknown as string }], { addGenerationPrompt: false });
  let withImage: string;
  let without: string;
  try {
    withImage = render([{ type: "text", text: marker }, { type: "image" }]);
    without = render([{ type: "text", text: marker }]);
  } catch (e) {
    if (e instanceof RlqError) throw e;
    return null; // a template that cannot render a content part list has no image placeholder
  }
  const at = withImage.indexOf(marker);
  if (at < 0 || without.indexOf(marker) !== at) return null;
  const after = withImage.slice(at + marker.length);
  const rest = without.slice(at + marker.length);
  if (!after.endsWith(rest)) return null;
  const placeholder = after.slice(0, after.length - rest.length);
  return placeholder === "" ? null : placeholder;
}
