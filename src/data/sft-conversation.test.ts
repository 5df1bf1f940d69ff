import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { chatTokenizerDir } from "../../test/helpers/chat-tokenizer.ts";
import { loadHfTokenizer, type ChatMessage } from "../engines/hf-tokenizer.ts";
import { promptRowFromRecord } from "./chat-template.ts";
import { conversationLabel, conversationResponse, readConversationLabel } from "./sft-conversation.ts";
import { sftResponse } from "../controller/sft-collect.ts";
import { createByteTokenizer } from "./tokenizer.ts";

/**
 * The loss mask of an SFT conversation: the test tokenizer's ChatML template
 * (`<|im_start|>ROLE\nCONTENT<|im_end|>\n`, generation prompt `<|im_start|>assistant\n`) has
 * one token per character, so each expectation is spelled out as text: mask 1 exactly on an
 * assistant turn's `CONTENT<|im_end|>\n` (slime/utils/mask_utils.py, MultiTurnLossMaskGenerator's
 * qwen masks), 0 on the other turns and on a later assistant turn's generation prompt.
 */
const tok = await loadHfTokenizer(chatTokenizerDir());
const keys = { input_key: "messages", label_key: "label", metadata_key: "metadata" };
const options = { applyChatTemplate: true, chatTemplate: tok, sftConversations: true };

/** The masked spans of a response, as text pieces with their mask bit. */
function spans(tokens: number[], mask: number[]): Array<[string, number]> {
  const out: Array<[string, number]> = [];
  let start = 0;
  for (let i = 1; i <= tokens.length; i++) {
    if (i === tokens.length || mask[i] !== mask[start]) {
      out.push([tok.decode(tokens.slice(start, i)), mask[start] as number]);
      start = i;
    }
  }
  return out;
}

function row(record: Record<string, unknown>) {
  const r = promptRowFromRecord(record, 1, keys, options);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}

describe("SFT conversations", () => {
  const messages: ChatMessage[] = [
    { role: "system", content: "sys" },
    { role: "user", content: "q1" },
    { role: "assistant", content: "a1" },
    { role: "user", content: "q2" },
    { role: "assistant", content: "a2" },
  ];

  it("a whole conversation in input_key: the prompt ends at the first assistant turn, mask 1 on assistant turns only", () => {
    const r = row({ messages });
    expect(r.prompt).toBe("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n");
    expect(readConversationLabel(r.label as string)).toEqual({ messages });
    const res = conversationResponse(tok, { messages }, r.prompt);
    if (!res.ok) throw new Error(res.error);
    expect(res.value.tokens).toHaveLength(res.value.lossMask.length);
    expect(spans(res.value.tokens, res.value.lossMask)).toEqual([
      ["a1<|im_end|>\n", 1],
      ["<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n", 0],
      ["a2<|im_end|>\n", 1],
    ]);
    // The prompt's tokens then the response's are the whole conversation's.
    expect([...tok.encode(r.prompt), ...res.value.tokens]).toEqual(tok.encodeChat(messages, { addGenerationPrompt: false }));
  });

  it("a prompt in input_key with the turns that follow it in label_key is the same conversation", () => {
    const r = row({ messages: "q1", label: [{ role: "assistant", content: "a1" }] });
    expect(readConversationLabel(r.label as string)).toEqual({
      messages: [
        { role: "user", content: "q1" },
        { role: "assistant", content: "a1" },
      ],
    });
    const res = sftResponse(tok, r.label as string, r.prompt, {});
    if (!res.ok) throw new Error(res.error);
    expect(spans(res.value.tokens, res.value.lossMask)).toEqual([["a1<|im_end|>\n", 1]]);
  });

  it("slime's step_loss_mask: an assistant turn with step_loss_mask 0 is not trained", () => {
    const m = messages.map((x) => (x.content === "a1" ? { ...x, step_loss_mask: 0 } : x));
    const res = conversationResponse(tok, { messages: m }, row({ messages: m }).prompt);
    if (!res.ok) throw new Error(res.error);
    expect(spans(res.value.tokens, res.value.lossMask)).toEqual([
      ["a1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n", 0],
      ["a2<|im_end|>\n", 1],
    ]);
  });

  it("a text response is trained whole, with EOS, as before", () => {
    const r = promptRowFromRecord({ messages: "q1", label: "a1" }, 1, keys, options);
    if (!r.ok) throw new Error(r.error);
    expect(r.value.label).toBe("a1");
    const res = sftResponse(tok, "a1", r.value.prompt, {});
    if (!res.ok) throw new Error(res.error);
    expect(spans(res.value.tokens, res.value.lossMask)).toEqual([["a1<|im_end|>", 1]]);
  });

  it("refuses, naming what to change: an assistant turn first, no assistant turn, a byte tokenizer, a template that rewrites earlier turns", () => {
    const first = promptRowFromRecord({ messages: [{ role: "assistant", content: "a" }] }, 1, keys, options);
    expect(first.ok ? "" : first.error).toMatch(/starts with an assistant turn: put a user \(or system\) turn before it/);
    const none = promptRowFromRecord({ messages: "q", label: [{ role: "user", content: "q2" }] }, 1, keys, options);
    expect(none.ok ? "" : none.error).toMatch(/label_key 'label' holds no assistant turn/);
    const label = conversationLabel({ messages });
    const bytes = sftResponse(createByteTokenizer(), label, "", {});
    expect(bytes.ok ? "" : bytes.error).toMatch(/set tokenizer: hf/);

    // A template that writes the number of turns first: every added turn changes the text before it.
    const dir = chatTokenizerDir();
    writeFileSync(
      join(dir, "tokenizer_config.json"),
      JSON.stringify({
        eos_token: "<|im_end|>",
        chat_template: "{{ messages | length }}{% for m in messages %}{{ m['role'] + m['content'] }}{% endfor %}",
      }),
    );
    return loadHfTokenizer(dir).then((counting) => {
      const prompt = counting.applyChatTemplate(messages.slice(0, 2));
      const res = conversationResponse(counting, { messages }, prompt);
      expect(res.ok ? "" : res.error).toMatch(/rewrites earlier turns when turn 2 \(assistant\) is added/);
      const drift = conversationResponse(tok, { messages }, "another prompt");
      expect(drift.ok ? "" : drift.error).toMatch(/render differently from the drawn prompt/);
    });
  });
});
