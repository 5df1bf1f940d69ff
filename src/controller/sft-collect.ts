/**
 * The collect phase of an SFT run (loss_type sft_loss; docs/sft.md): what slime's
 * slime/rollout/sft_rollout.py does in its rollout function, without an engine. Each drawn row
 * becomes a group of one sample whose response is the row's label (label_key), tokenized, with
 * EOS, loss mask 1 and reward 0; or, for a conversation, the turns after its prompt with loss mask
 * 1 on its assistant turns (src/data/sft-conversation.ts).
 *
 * The decisions are the RL run's (`prompts.drawn`, `group.dispatched`, outcomes, `step.sealed`),
 * so epochs, the cursor, history rows, the train job, syncs, evals and replay are unchanged. Only
 * the round's facts come from the controller instead of a rollout job: they are a function of the
 * drawn row (the `drawn_prompts` row committed with the draw), written after the commit that
 * dispatches them and, after a crash in between, on the next tick (the first write of a round
 * wins, store/rollout-facts.ts), so a restarted run writes exactly the facts it would have.
 * Reconcile expects no rollout job for these rounds (reconcile.ts).
 */

import { loadRoundStatuses, writeRewardsOfRounds, writeRounds, type RoundFacts } from "../store/rollout-facts.ts";
import { insertDrawnPrompts, loadDrawnPrompts } from "../store/run-facts.ts";
import { dispatchDecision, sealDecision, shouldDrawMore } from "../core/decide-groups.ts";
import type { Decision } from "../core/decisions.ts";
import type { Tokenizer } from "../data/tokenizer.ts";
import { conversationResponse, readConversationLabel, type ConversationResponse, type ConversationTokenizer } from "../data/sft-conversation.ts";
import { planDraw } from "./draw.ts";
import type { ControllerHost } from "./host.ts";
import { decideReady, inflightRounds, landedRounds, type RoundKey } from "./groups.ts";

export async function collectSft(h: ControllerHost): Promise<boolean> {
  return collectWritten(h, writeMissingRounds);
}

/**
 * The collect phase of a run whose rounds the controller writes itself (SFT here, a train-only
 * replay in recorded-collect.ts): `write` writes the dispatched rounds that have no facts yet and
 * returns how many, or null when the run was paused; `draw` draws and dispatches in one commit.
 */
export async function collectWritten(
  h: ControllerHost,
  write: (h: ControllerHost, keys: readonly RoundKey[]) => Promise<number | null>,
  draw: (h: ControllerHost) => Promise<void> = drawRows,
): Promise<boolean> {
  const s = h.state;
  const keys = inflightRounds(h);
  const written = await write(h, keys);
  if (written === null) return true; // paused on a bad row
  const { ready } = await landedRounds(h, keys);
  ready.sort((a, b) => a - b);
  await decideReady(h, ready);
  const seal = sealDecision(s);
  if (seal) {
    await h.commit([seal]);
    h.deps.crashPoint("controller.after_seal");
    return true;
  }
  if (shouldDrawMore(s)) {
    await draw(h);
    return true;
  }
  return ready.length > 0 || written > 0;
}

/** Draw rollout_batch_size rows and dispatch them in one commit; their facts are written by the next tick. */
async function drawRows(h: ControllerHost): Promise<void> {
  const s = h.state;
  const want = s.config.rollout_batch_size - s.kept.length - s.inflight.size;
  const { fromBuffer, draws, cursor, rows } = await planDraw({ dataset: h.dataset, tokenizer: h.ctx.tokenizer, bufferFilter: h.bufferFilter }, s, want, s.step);
  const list: Decision[] = [
    { kind: "prompts.drawn", payload: { step: s.step, fromBuffer, fresh: draws, cursor } },
    ...draws.map((d) => dispatchDecision(s, d.groupId, 0)),
  ];
  await h.commit(list, (tx) => insertDrawnPrompts(tx, rows));
  h.deps.crashPoint("controller.after_draw");
}

/**
 * The facts of the dispatched rounds that have none yet, with their rewards (0: SFT has none).
 * Returns how many rounds were written, or null when a row cannot be trained (the run is paused
 * with the reason).
 */
async function writeMissingRounds(h: ControllerHost, keys: readonly RoundKey[]): Promise<number | null> {
  const s = h.state;
  if (keys.length === 0) return 0;
  const statuses = await loadRoundStatuses(h.deps.db, s.runId, keys);
  // A round written without its reward (a crash between the two writes) is written again: the round write is a no-op then.
  const missing = keys.filter((k) => (statuses.get(k.groupId)?.rewardCount ?? 0) < 1);
  if (missing.length === 0) return 0;
  const prompts = await loadDrawnPrompts(
    h.deps.db,
    s.runId,
    missing.map((k) => k.groupId),
  );
  const rounds: RoundFacts[] = [];
  for (const k of missing) {
    const row = prompts.get(k.groupId);
    const step = s.groups.get(k.groupId)?.step ?? s.step;
    if (!row || row.label === null) {
      await h.pause(
        `SFT: draw ${k.groupId} has no response (its row's label_key field "${s.config.label_key}" is missing): add it to every row of the dataset`,
      );
      return null;
    }
    const response = sftResponse(h.ctx.tokenizer, row.label, row.prompt, s.config.apply_chat_template_kwargs);
    if (!response.ok) {
      await h.pause(`SFT: dataset row ${row.datasetIndex} (draw ${k.groupId}): ${response.error}`);
      return null;
    }
    const { tokens, lossMask } = response.value;
    if (tokens.length > s.config.rollout_max_response_len) {
      await h.pause(
        `SFT: the response of dataset row ${row.datasetIndex} (draw ${k.groupId}) is ${tokens.length} tokens with its end token, over rollout_max_response_len ${s.config.rollout_max_response_len}: raise rollout_max_response_len or shorten the row`,
      );
      return null;
    }
    if (row.promptTokens.length + tokens.length > (s.config.rollout_max_context_len ?? Infinity)) {
      await h.pause(
        `SFT: dataset row ${row.datasetIndex} (draw ${k.groupId}) is ${row.promptTokens.length + tokens.length} tokens, over rollout_max_context_len ${s.config.rollout_max_context_len}: raise it or shorten the row`,
      );
      return null;
    }
    rounds.push(roundFacts(s.runId, k, step, s.weightVersion, tokens, lossMask));
  }
  await writeRounds(h.deps.db, rounds);
  await writeRewardsOfRounds(
    h.deps.db,
    rounds.map((r) => ({
      key: { runId: r.runId, groupId: r.groupId, round: r.round, step: r.step, jobId: r.jobId },
      rewards: [{ sampleIndex: 0, reward: 0, components: {} }],
    })),
  );
  return rounds.length;
}

/**
 * One round of one sample: the response as if generated (rollout log-probs 0, finished), its loss mask 1 on
 * every token unless given (a conversation's: 1 on its assistant turns only).
 */
export function roundFacts(
  runId: string,
  key: RoundKey,
  step: number,
  weightVersion: number,
  tokens: readonly number[],
  lossMask: readonly number[] = tokens.map(() => 1),
): RoundFacts {
  return {
    runId,
    groupId: key.groupId,
    round: key.round,
    step,
    jobId: `sft-${runId}-${key.groupId}-${key.round}`,
    expectedWeightVersion: weightVersion,
    isComplete: true,
    wasAborted: false,
    segments: [
      {
        sampleIndex: 0,
        segmentIndex: 0,
        round: key.round,
        weightVersion,
        tokens: [...tokens],
        logProbs: tokens.map(() => 0),
        lossMask: [...lossMask],
        finishReason: "stop",
        status: "completed",
        engine: "dataset",
        tokenStart: 0,
        error: null,
      },
    ],
  };
}

/**
 * A drawn row's response tokens and loss mask: a conversation's (its label is one, src/data/sft-conversation.ts)
 * rendered by the tokenizer's chat template, else the text response's tokens with EOS, all trained.
 */
export function sftResponse(
  tokenizer: Tokenizer,
  label: string,
  prompt: string,
  chatTemplateKwargs: Record<string, unknown>,
): { ok: true; value: ConversationResponse } | { ok: false; error: string } {
  const conversation = readConversationLabel(label);
  if (conversation === null) {
    const tokens = responseTokens(tokenizer, label);
    return { ok: true, value: { tokens, lossMask: tokens.map(() => 1) } };
  }
  if (!isChatTokenizer(tokenizer))
    return {
      ok: false,
      error: `its response is a conversation, which the chat template renders: set tokenizer: hf (the run's tokenizer is ${tokenizer.name})`,
    };
  return conversationResponse(tokenizer, conversation, prompt, chatTemplateKwargs);
}

function isChatTokenizer(t: Tokenizer): t is Tokenizer & ConversationTokenizer {
  return typeof (t as Partial<ConversationTokenizer>).applyChatTemplate === "function";
}

/**
 * A response's tokens: the text encoded without what the tokenizer puts before every text (a
 * BOS: the response continues the prompt), then EOS, which the model must learn to stop with.
 */
export function responseTokens(tokenizer: Tokenizer, response: string): number[] {
  const lead = tokenizer.encode("");
  const ids = tokenizer.encode(response);
  const isLed = lead.length > 0 && lead.every((t, i) => ids[i] === t);
  return [...(isLed ? ids.slice(lead.length) : ids), tokenizer.eosId];
}
