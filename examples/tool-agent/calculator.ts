/**
 * The calculator tool of the tool-agent example: integer arithmetic with
 * `+ - *`, parentheses and the usual precedence, nothing else (no eval). It
 * is what the environment runs when the model writes `(3*4)`.
 */
export function calculate(expression: string): number | null {
  const src = expression.replace(/\s+/g, "");
  let i = 0;
  const peek = () => src[i];
  const number = (): number | null => {
    if (peek() === "(") {
      i++;
      const v = sum();
      if (v === null || peek() !== ")") return null;
      i++;
      return v;
    }
    if (peek() === "-") {
      i++;
      const v = number();
      return v === null ? null : -v;
    }
    const m = /^\d+/.exec(src.slice(i));
    if (!m) return null;
    i += m[0].length;
    return Number(m[0]);
  };
  const product = (): number | null => {
    let v = number();
    while (v !== null && peek() === "*") {
      i++;
      const r = number();
      v = r === null ? null : v * r;
    }
    return v;
  };
  const sum = (): number | null => {
    let v = product();
    while (v !== null && (peek() === "+" || peek() === "-")) {
      const op = src[i++];
      const r = product();
      v = r === null ? null : op === "+" ? v + r : v - r;
    }
    return v;
  };
  const value = sum();
  if (value === null || i !== src.length || !Number.isSafeInteger(value)) return null;
  return value;
}

/**
 * The tool call at the end of `text`, if any: the innermost-last `( ... )`
 * whose `)` is the last character. `"12+(3*4)"` → `"3*4"`; `"12+3"` → null.
 */
export function trailingToolCall(text: string): string | null {
  if (!text.endsWith(")")) return null;
  let depth = 0;
  for (let i = text.length - 1; i >= 0; i--) {
    if (text[i] === ")") depth++;
    else if (text[i] === "(") {
      depth--;
      if (depth === 0) return text.slice(i + 1, text.length - 1);
    }
  }
  return null;
}
