/**
 * LaTeX → plain text as pylatexenc 2.10's `LatexNodes2Text().latex_to_text`
 * renders the macros that occur in math answers. slime's sympy-side
 * normaliser (`_parse_latex`) runs it and then maps `√ π ∞ ∪ · ×` to
 * `sqrt pi inf U * *`, so its quirks are part of the grading rules:
 *
 * - `\frac{a}{b}` renders as `a/b` WITHOUT parentheses (`\frac{x+1}{2}` →
 *   `x+1/2`), which is why unreduced-fraction and mixed-number rules work on
 *   plain `a/b` strings;
 * - `\sqrt[n]{x}` renders as `√(x)`: the index is dropped;
 * - an unknown macro renders as nothing, and a macro that pylatexenc's parser
 *   knows to take arguments but that has no text rule (`\mbox`, `\texttt`,
 *   `\not`, `\label`, ...) swallows its arguments too;
 * - the space after a control word is dropped; other spaces are kept (they
 *   matter: `7 3/4` becomes the mixed number `7+3/4` later).
 *
 * Not reproduced: the unicode styling of `\mathbb` & co. (we keep the plain
 * letters), combining accents of `\hat{x}` & co. (we keep the base), and
 * environments (we render `\begin{..}`/`\end{..}` as nothing and keep the body).
 */

import { SYMBOLS } from "./latex-symbols.ts";

/** Argument spec per macro (`[` optional, `{` mandatory, `*` optional star) and how it renders. */
type Render = (args: readonly string[]) => string;
interface ArgMacro {
  spec: string;
  render: Render;
}
const first: Render = (a) => a[0] ?? "";
const nothing: Render = () => "";
const nth =
  (i: number): Render =>
  (a) =>
    a[i] ?? "";

const ONE_ARG_CONTENT = [
  "text",
  "textrm",
  "textit",
  "textbf",
  "textsc",
  "textsl",
  "emph",
  "mathrm",
  "mathbf",
  "mathit",
  "mathsf",
  "mathbb",
  "mathtt",
  "mathcal",
  "mathscr",
  "mathfrak",
  "overline",
  "underline",
  "widehat",
  "widetilde",
  "wideparen",
  "overleftarrow",
  "overrightarrow",
  "overleftrightarrow",
  "underleftarrow",
  "underrightarrow",
  "underleftrightarrow",
  "overbrace",
  "underbrace",
  "overgroup",
  "undergroup",
  "overbracket",
  "underbracket",
  "overlinesegment",
  "underlinesegment",
  "overleftharpoon",
  "overrightharpoon",
  // accents: pylatexenc adds a combining mark to the base; we keep the base only
  "vec",
  "dot",
  "hat",
  "check",
  "breve",
  "acute",
  "grave",
  "tilde",
  "bar",
  "ddot",
  "'",
  "`",
  '"',
  "c",
  "^",
  "~",
  "H",
  "k",
  "=",
  "b",
  ".",
  "d",
  "r",
  "u",
  "v",
];
// Known to pylatexenc's parser with one argument but without a text rule: rendered as nothing.
const ONE_ARG_DISCARDED = [
  "mbox",
  "texttt",
  "textup",
  "textmd",
  "textsf",
  "ensuremath",
  "label",
  "ref",
  "autoref",
  "cref",
  "Cref",
  "eqref",
  "hypersetup",
  "keywords",
  "bibliography",
  "not",
  "input",
  "include",
];

const ARG_MACROS: ReadonlyMap<string, ArgMacro> = new Map<string, ArgMacro>([
  ["frac", { spec: "{{", render: (a) => `${a[0] ?? ""}/${a[1] ?? ""}` }],
  ["nicefrac", { spec: "{{", render: (a) => `${a[0] ?? ""}/${a[1] ?? ""}` }],
  ["textfrac", { spec: "{{", render: (a) => `${a[0] ?? ""}/${a[1] ?? ""}` }],
  ["sqrt", { spec: "[{", render: (a) => `√(${a[1] ?? ""})` }],
  ["url", { spec: "{", render: (a) => `<${a[0] ?? ""}>` }],
  ["footnote", { spec: "[{", render: (a) => `[${a[1] ?? ""}]` }],
  ["hspace", { spec: "*{", render: nothing }],
  ["vspace", { spec: "*{", render: () => "\n" }],
  ["hphantom", { spec: "[{", render: nothing }],
  ["vphantom", { spec: "[{", render: nothing }],
  ["textcolor", { spec: "[{{", render: nth(2) }],
  ["colorbox", { spec: "[{{", render: nth(2) }],
  ["fcolorbox", { spec: "[{[{{", render: nth(4) }],
  ["color", { spec: "[{", render: nothing }],
  ["xleftarrow", { spec: "[{", render: nothing }],
  ["xrightarrow", { spec: "[{", render: nothing }],
  ["texorpdfstring", { spec: "{{", render: nth(1) }],
  ["ket", { spec: "{", render: (a) => `|${a[0] ?? ""}⟩` }],
  ["bra", { spec: "{", render: (a) => `⟨${a[0] ?? ""}|` }],
  ["braket", { spec: "{{", render: (a) => `⟨${a[0] ?? ""}|${a[1] ?? ""}⟩` }],
  ["begin", { spec: "{", render: nothing }],
  ["end", { spec: "{", render: nothing }],
  ["\\", { spec: "*[", render: () => "\n" }],
  ...ONE_ARG_CONTENT.map((n): [string, ArgMacro] => [n, { spec: "{", render: first }]),
  ...ONE_ARG_DISCARDED.map((n): [string, ArgMacro] => [n, { spec: "{", render: nothing }]),
]);

const SPECIALS: ReadonlyArray<readonly [string, string]> = [
  ["---", "—"],
  ["--", "–"],
  ["``", "“"],
  ["''", "”"],
  ["!`", "¡"],
  ["?`", "¿"],
  ["~", "\u00a0"],
  ["&", "   "],
];

class Walker {
  private pos = 0;
  constructor(private readonly src: string) {}

  /** Render nodes until `stop` (not consumed) or the end. */
  nodes(stop: string | null): string {
    let out = "";
    while (this.pos < this.src.length) {
      const ch = this.src[this.pos] as string;
      if (stop !== null && ch === stop) return out;
      out += this.node();
    }
    return out;
  }

  private node(): string {
    const s = this.src;
    const ch = s[this.pos] as string;
    if (ch === "\\") return this.macro();
    if (ch === "{") {
      this.pos += 1;
      const inner = this.nodes("}");
      if (s[this.pos] === "}") this.pos += 1;
      return inner;
    }
    if (ch === "}") {
      // A stray closing brace: tolerant parsing drops it (braces are deleted afterwards anyway).
      this.pos += 1;
      return "";
    }
    if (ch === "%") {
      const nl = s.indexOf("\n", this.pos);
      this.pos = nl < 0 ? s.length : nl + 1;
      return "";
    }
    for (const [from, to] of SPECIALS) {
      if (s.startsWith(from, this.pos)) {
        this.pos += from.length;
        return to;
      }
    }
    const cp = String.fromCodePoint(s.codePointAt(this.pos) ?? 0);
    this.pos += cp.length;
    return cp;
  }

  private macro(): string {
    const s = this.src;
    this.pos += 1; // the backslash
    const word = /^[A-Za-z]+/.exec(s.slice(this.pos));
    let name: string;
    if (word !== null) {
      name = word[0];
      this.pos += name.length;
      while (this.pos < s.length && /\s/.test(s[this.pos] as string)) this.pos += 1;
    } else if (this.pos < s.length) {
      name = s[this.pos] as string;
      this.pos += 1;
      if (name === "(" || name === ")" || name === "[" || name === "]") return ""; // math delimiters
    } else {
      return "";
    }
    const withArgs = ARG_MACROS.get(name);
    if (withArgs !== undefined) return withArgs.render(this.args(withArgs.spec));
    return SYMBOLS[name] ?? "";
  }

  private args(spec: string): string[] {
    const out: string[] = [];
    for (const kind of spec) {
      if (kind === "*") {
        if (this.src[this.pos] === "*") this.pos += 1;
        out.push("");
      } else if (kind === "[") {
        out.push(this.optionalArg());
      } else {
        out.push(this.mandatoryArg());
      }
    }
    return out;
  }

  private skipSpace(): void {
    while (this.pos < this.src.length && /\s/.test(this.src[this.pos] as string)) this.pos += 1;
  }

  private optionalArg(): string {
    this.skipSpace();
    if (this.src[this.pos] !== "[") return "";
    this.pos += 1;
    const inner = this.nodes("]");
    if (this.src[this.pos] === "]") this.pos += 1;
    return inner;
  }

  private mandatoryArg(): string {
    this.skipSpace();
    const ch = this.src[this.pos];
    if (ch === undefined || ch === "}") return "";
    // `{...}` renders its content; `\macro` renders as one node; otherwise one character.
    if (ch === "{" || ch === "\\") return this.node();
    const cp = String.fromCodePoint(this.src.codePointAt(this.pos) ?? 0);
    this.pos += cp.length;
    return cp;
  }
}

/** pylatexenc 2.10 `LatexNodes2Text().latex_to_text(latex)` for answer-sized LaTeX (see file comment). */
export function latexToText(latex: string): string {
  return new Walker(latex).nodes(null);
}
