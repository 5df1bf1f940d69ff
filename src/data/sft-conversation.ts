/**
 * SFT on chat message lists (loss_type sft_loss with apply_chat_template: true; docs/sft.md): a
 * conversation of system, user, assistant (and tool) turns trains the model on its assistant turns
 * only. slime does this in slime/rollout/sft_rollout.py with the loss mask of
 * slime/utils/mask_utils.py `MultiTurnLossMaskGenerator`: each turn is rendered by the chat
 * template, and an assistant turn's tokens after its generation prompt get mask 1 (its end-of-turn
 * token and what the template writes after it included); every other token 0, as is every token
 * of a turn with `step_loss_mask` other than 1.
 *
 * rlq finds the turns' boundaries by rendering prefixes of the conversation instead of single
 * turns, so that it needs no knowledge of a template's system prompt or generation prompt length:
 * the text a turn adds is render(turns 0..i) minus render(turns 0..i-1), and an assistant turn's
 * generation prompt is render(turns 0..i-1, add_generation_prompt) minus the text before it. A
 * template that rewrites earlier turns when a later one is added (one that drops an earlier
 * turn's reasoning, say) has no such prefixes, and the row is refused with the turn named.
 *
 * The prompt is the conversation up to its first assistant turn, rendered with the generation
 * prompt: the drawn row's prompt, what an engine would be sent. The response is every token after
 * it. Each piece is encoded on its own, as slime encodes each turn on its own.
 */
import type { ChatMessage, HfTokenizer } from "../engines/hf-tokenizer.ts";

/** What the rendering needs of a tokenizer: `HfTokenizer` satisfies it. */
export type ConversationTokenizer = Pick<HfTokenizer, "applyChatTemplate" | "encode">;

/** A conversation row: its turns, first assistant turn onwards being the response, and the row's tools. */
export interface SftConversation {
  messages: ChatMessage[];
  tools?: unknown[];
}

/** The response tokens of a conversation row and their loss mask, one entry per token. */
export interface ConversationResponse {
  tokens: number[];
  lossMask: number[];
}

/**
 * The drawn row's `label` of a conversation: its turns and tools as JSON, so that the response is a
 * function of the committed draw (drawn_prompts.label) as a text response is.
 */
export function conversationLabel(c: SftConversation): string {
  return JSON.stringify(c.tools === undefined ? { messages: c.messages } : { messages: c.messages, tools: c.tools });
}

/** The conversation a label holds (conversationLabel), or null for a text response. */
export function readConversationLabel(label: string): SftConversation | null {
  if (!label.startsWith('{"messages":')) return null;
  let parsed: unknown;
  try {
    parsed = JSON.parse(label);
  } catch {
    return null; // a text response that happens to start like one: trained as text
  }
  const o = parsed as { messages?: unknown; tools?: unknown };
  if (!Array.isArray(o.messages) || !o.messages.every((m) => typeof m === "object" && m !== null && typeof (m as ChatMessage).role === "string")) return null;
  return { messages: o.messages as ChatMessage[], ...(Array.isArray(o.tools) ? { tools: o.tools } : {}) };
}

/** Index of the first assistant turn, where the response starts; -1 when there is none. */
export function firstAssistantTurn(messages: readonly ChatMessage[]): number {
  return messages.findIndex((m) => m.role === "assistant");
}

/**
 * The tokens after the prompt and their loss mask: 1 on the tokens of each assistant turn after its
 * generation prompt, 0 elsewhere. `prompt` is the drawn row's prompt text, which must be the
 * conversation's turns before the first assistant turn rendered with the generation prompt.
 */
export function conversationResponse(
  tok: ConversationTokenizer,
  c: SftConversation,
  prompt: string,
  extra: Record<string, unknown> = {},
): { ok: true; value: ConversationResponse } | { ok: false; error: string } {
  const first = firstAssistantTurn(c.messages);
  if (first < 1)
    return {
      ok: false,
      error:
        first === 0
          ? "the conversation starts with an assistant turn: put a user (or system) turn first"
          : "the conversation has no assistant turn to train on",
    };
  const render = (turns: number, isGenerationPrompt: boolean) =>
    tok.applyChatTemplate(c.messages.slice(0, turns), { addGenerationPrompt: isGenerationPrompt, extra, ...(c.tools ? { tools: c.tools } : {}) });
  let before = render(first, true);
  if (before !== prompt)
    return {
      ok: false,
      error: "the turns before the first assistant turn render differently from the drawn prompt (the chat template or apply_chat_template_kwargs changed)",
    };
  const tokens: number[] = [];
  const lossMask: number[] = [];
  const add = (text: string, bit: 0 | 1, what: string): string | null => {
    if (!text.startsWith(before))
      return `the chat template rewrites earlier turns when ${what} is added, so its tokens cannot be told apart: use a template that only appends`;
    const ids = tok.encode(text.slice(before.length));
    tokens.push(...ids);
    for (let i = 0; i < ids.length; i++) lossMask.push(bit);
    before = text;
    return null;
  };
  for (let i = first; i < c.messages.length; i++) {
    const m = c.messages[i] as ChatMessage;
    const what = `turn ${i} (${m.role})`;
    // The first assistant turn's generation prompt ends the prompt; a later one's is a response token with mask 0.
    const header = m.role === "assistant" && i > first ? add(render(i, true), 0, `the generation prompt of ${what}`) : null;
    if (header !== null) return { ok: false, error: header };
    const isTrained = m.role === "assistant" && (m.step_loss_mask ?? 1) === 1;
    const body = add(render(i + 1, false), isTrained ? 1 : 0, what);
    if (body !== null) return { ok: false, error: body };
  }
  return { ok: true, value: { tokens, lossMask } };
}
