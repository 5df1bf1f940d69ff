import { readFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { RunConfig } from "../config/run-config.ts";
import type { Tokenizer } from "../data/tokenizer.ts";
import type { RewardInput } from "./reward-scorer.ts";
import { RlqError } from "../lib/errors.ts";
import { ifMissing } from "../lib/if-missing.ts";
import { getRewardFunction } from "../reward/index.ts";
import { Tokenizer as ModelTokenizer } from "../model/tokenizer.ts";
import { loadPromptData } from "../data/dataset.ts";
import { filterLongPrompts } from "../data/chat-template.ts";

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
  const chatTemplate = c.apply_chat_template ? await (await import("../engines/hf-tokenizer.ts")).loadHfTokenizer(c.hf_checkpoint as string) : null;
  const ds = await loadPromptData(c.prompt_data, c, {
    applyChatTemplate: c.apply_chat_template,
    chatTemplate,
    chatTemplateKwargs: c.apply_chat_template_kwargs,
    isBadRowFatal: c.bad_row_policy === "fail",
  });
  return filterLongPrompts(ds, (p) => tokenizer.encode(p).length, c.rollout_max_prompt_len);
}
