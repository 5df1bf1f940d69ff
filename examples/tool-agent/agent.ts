import type { CustomGenerateHelpers, CustomGenerateSample, Turn } from "../../src/rollout/custom-generate.ts";
import { calculate, trailingToolCall } from "./calculator.ts";

/**
 * A calculator-using agent as a custom generate function
 * (`custom_generate_function_path: examples/tool-agent/agent.ts`), written for
 * the demo model's vocabulary (digits, `+ - * = ( ) ? .`, space, `\boxed{`, `}`):
 *
 * - a tool call is a parenthesised expression the model writes, `(3*4)`;
 *   generation stops at `)` (an extra stop token for this call);
 * - the environment appends `=12` (or `=?` when the expression is not
 *   arithmetic) as tool tokens: loss mask 0, log-prob 0, never trained on;
 * - generation continues from there, until EOS, the budget, or
 *   `MAX_TOOL_CALLS`.
 *
 * Resuming a partial rollout works unchanged: the function only looks at the
 * text of the response so far plus this round's turns.
 */
export const MAX_TOOL_CALLS = 4;

export async function generate(
  _args: unknown,
  sample: CustomGenerateSample,
  helpers: CustomGenerateHelpers,
): Promise<{ turns: Turn[]; status?: "completed" | "truncated" }> {
  const close = helpers.tokenizer.encode(")");
  const turns: Turn[] = [];
  let calls = 0;
  for (;;) {
    const t = await helpers.generate(turns, { extraStopTokenIds: close });
    turns.push(t);
    const lastToken = t.tokens[t.tokens.length - 1];
    const isToolCall = t.finishReason === "stop" && lastToken !== undefined && close.includes(lastToken);
    if (!isToolCall) break; // EOS, length or abort: the round is over
    const text = sample.response + turns.map((x) => (x.kind === "engine" ? x.text : (x.text ?? ""))).join("");
    const expression = trailingToolCall(text);
    const value = expression === null ? null : calculate(expression);
    const output = helpers.tool(`=${value === null ? "?" : String(value)}`);
    if (output.tokens.length > helpers.remainingTokens(turns)) return { turns, status: "truncated" };
    turns.push(output);
    if (++calls >= MAX_TOOL_CALLS) break;
  }
  return { turns };
}
