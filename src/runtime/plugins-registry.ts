import { readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import type { RunConfig } from "../config/run-config.ts";
import type { Tokenizer } from "../data/tokenizer.ts";
import type { RewardInput } from "./reward-scorer.ts";
import { RlqError } from "../lib/errors.ts";
import { ifMissing } from "../lib/if-missing.ts";
import { getRewardFunction } from "../reward/index.ts";
import { Tokenizer as ModelTokenizer } from "../model/tokenizer.ts";
import { loadPromptData } from "../data/dataset.ts";
import { filterLongPrompts, type PromptRecordKeys } from "../data/chat-template.ts";
import type { EvalDataset } from "../config/eval-datasets.ts";
import { readEnv } from "../config/env.ts";

/**
 * Where the built-in capabilities are looked up by name: reward types from
 * the reward hub, the embedded model's tokenizer. Kept in one place so the
 * rest of the runtime does not import every capability eagerly.
 */
export function resolveRmType(rmType: string): ((s: RewardInput) => unknown) | null {
  const fn = getRewardFunction(rmType);
  return (s) => fn({ response: s.response, label: s.label, metadata: s.metadata });
}

/**
 * `tokenizer: model`: the embedded model's tokenizer, from `tokenizer.json`
 * in the ref_load checkpoint directory or beside it. Prompts are BOS + text.
 */
export async function tokenizerFor(config: RunConfig): Promise<Tokenizer> {
  if (config.tokenizer === "hf") {
    const { loadHfTokenizer } = await import("../engines/hf-tokenizer.ts");
    return loadHfTokenizer(config.hf_checkpoint as string);
  }
  if (!config.ref_load) throw new RlqError("config_invalid", "tokenizer: model needs ref_load (its tokenizer.json sits in or beside the checkpoint)");
  const candidates = [join(config.ref_load, "tokenizer.json"), join(dirname(config.ref_load), "tokenizer.json")];
  for (const file of candidates) {
    const text = await readFile(file, "utf8").catch(ifMissing(null));
    if (text === null) continue;
    const t = new ModelTokenizer(JSON.parse(text));
    return {
      name: `model:${file}`,
      vocabSize: t.vocabSize,
      eosId: t.eosId,
      encode: (s) => t.formatPrompt(s),
      decode: (ids) => t.decode(ids),
    };
  }
  throw new RlqError("config_invalid", `tokenizer: model: no tokenizer.json in ${candidates.join(" or ")}`);
}

/**
 * The run's prompt dataset as the controller and `rlq run start` both see it:
 * JSONL or Parquet, the chat template applied when asked, prompts longer than
 * rollout_max_prompt_len filtered out at load time (slime).
 */
export async function loadRunDataset(c: RunConfig, tokenizer: Tokenizer) {
  return loadPromptDataset(c, tokenizer, {
    path: c.prompt_data,
    keys: c,
    applyChatTemplate: c.apply_chat_template,
    chatTemplateKwargs: c.apply_chat_template_kwargs,
    maxPromptLen: c.rollout_max_prompt_len,
    names: { dataset: "prompt_data", bound: "rollout_max_prompt_len" },
    sftConversations: c.loss_type === "sft_loss",
  });
}

/**
 * An eval dataset through the same pipeline as the run's prompts (slime's eval builds its
 * `Dataset` as the rollout does: slime/rollout/sglang_rollout.py eval_rollout_single_dataset),
 * with the dataset's own keys, chat template kwargs and eval_max_prompt_len.
 */
export async function loadEvalDataset(c: RunConfig, d: EvalDataset, tokenizer: Tokenizer) {
  return loadPromptDataset(c, tokenizer, {
    path: d.path,
    keys: d.keys,
    applyChatTemplate: d.applyChatTemplate,
    chatTemplateKwargs: d.chatTemplateKwargs,
    maxPromptLen: d.maxPromptLen,
    names: { dataset: `eval_prompt_data.${d.name}`, bound: "eval_max_prompt_len" },
  });
}

async function loadPromptDataset(
  c: RunConfig,
  tokenizer: Tokenizer,
  o: {
    path: string;
    keys: PromptRecordKeys;
    applyChatTemplate: boolean;
    chatTemplateKwargs: Record<string, unknown>;
    maxPromptLen: number | null;
    names: { dataset: string; bound: string };
    sftConversations?: boolean;
  },
) {
  const chatTemplate = o.applyChatTemplate ? await (await import("../engines/hf-tokenizer.ts")).loadHfTokenizer(c.hf_checkpoint as string) : null;
  const ds = await loadPromptData(o.path, o.keys, {
    applyChatTemplate: o.applyChatTemplate,
    chatTemplate,
    chatTemplateKwargs: o.chatTemplateKwargs,
    isBadRowFatal: c.bad_row_policy === "fail",
    sftConversations: o.sftConversations ?? false,
    // Inline images (data URIs, Parquet bytes) are kept by content hash under RLQ_HOME, never in Postgres.
    ...(c.multimodal_keys ? { multimodalKeys: c.multimodal_keys, imageStoreDir: resolve(readEnv().RLQ_HOME, "images") } : {}),
  });
  return filterLongPrompts(ds, (p) => tokenizer.encode(p).length, o.maxPromptLen, o.names);
}
