/**
 * Reads the plain-text expressions that slime hands to sympy's `parse_expr`
 * (after its `_normalize`: lowercase, no spaces, `sqrt(..)`, `pi`, `a/b`) and
 * builds MathJSON for Compute Engine, following the parse rules slime uses:
 * `^` is power (slime turns it into `**`), Python precedence (`-x^2` is
 * `-(x^2)`, `2^-1` is allowed, `^` is right-associative), and sympy's
 * `implicit_multiplication_application` (`2x`, `2(x+1)`, `(a)(b)`, `xy` → x·y).
 *
 * Returns null for anything sympy would fail to parse or that names a sympy
 * object we do not model (`oo`, `nan`, `re`, ...): the grader treats that as
 * "not equal", as slime does when `parse_expr` raises.
 */

export type MathJson = number | string | { readonly num: string } | readonly [string, ...MathJson[]];

type Token =
  | { readonly kind: "num"; readonly text: string }
  | { readonly kind: "sym"; readonly name: string }
  | { readonly kind: "const"; readonly name: "Pi" }
  | { readonly kind: "func"; readonly name: "Sqrt" | "Ln" }
  | { readonly kind: "op"; readonly text: string };

const NUMBER = /(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:e[+-]?\d(?:_?\d)*)?/y;
const NAME = /[a-z_][a-z0-9_]*/y;
const OPS = ["**", "*", "/", "+", "-", "(", ")", "!"];
/** sympy names with at most two distinct letters that mean something other than a product of symbols. */
const UNMODELLED_NAMES = new Set(["oo", "nan", "zoo", "re", "im", "li", "ff", "rf", "eye"]);
/** Greek letter names that sympy keeps as one symbol instead of splitting. */
const GREEK_SYMBOLS = new Set(["mu", "nu", "xi"]);

/** Symbols get a prefix so that `e` and `i` stay plain symbols (as in sympy), not Euler's number and the imaginary unit. */
export function symbolName(name: string): string {
  return `v${name}`;
}

function nameTokens(name: string): Token[] | null {
  if (name === "pi") return [{ kind: "const", name: "Pi" }];
  if (name === "sqrt") return [{ kind: "func", name: "Sqrt" }];
  if (name === "ln") return [{ kind: "func", name: "Ln" }];
  if (UNMODELLED_NAMES.has(name) || name.includes("sqrt")) return null;
  if (GREEK_SYMBOLS.has(name) || name.includes("_")) return [{ kind: "sym", name }];
  // sympy's split_symbols: `xy2` → x·y·2
  const out: Token[] = [];
  for (const part of name.match(/[a-z]|\d+/g) ?? []) {
    out.push(/\d/.test(part) ? { kind: "num", text: part } : { kind: "sym", name: part });
  }
  return out;
}

function tokenize(text: string): Token[] | null {
  const out: Token[] = [];
  let i = 0;
  while (i < text.length) {
    NUMBER.lastIndex = i;
    const num = NUMBER.exec(text);
    if (num !== null) {
      out.push({ kind: "num", text: num[0] });
      i += num[0].length;
      continue;
    }
    NAME.lastIndex = i;
    const name = NAME.exec(text);
    if (name !== null) {
      const toks = nameTokens(name[0]);
      if (toks === null) return null;
      out.push(...toks);
      i += name[0].length;
      continue;
    }
    const op = OPS.find((o) => text.startsWith(o, i));
    if (op === undefined) return null;
    out.push({ kind: "op", text: op });
    i += op.length;
  }
  return out;
}

function numberJson(text: string): MathJson | null {
  const clean = text.replaceAll("_", "");
  if (/^\d+$/.test(clean)) {
    // Python 3 rejects `0123`; it tokenizes as `0` `123`, which sympy cannot parse.
    if (clean.length > 1 && clean.startsWith("0") && /[1-9]/.test(clean)) return null;
    const n = Number(clean);
    return Number.isSafeInteger(n) ? n : { num: clean.replace(/^0+(?=\d)/, "") };
  }
  const f = Number(clean);
  return Number.isFinite(f) ? f : null;
}

class Parser {
  private pos = 0;
  constructor(private readonly toks: readonly Token[]) {}

  parse(): MathJson | null {
    if (this.toks.length === 0) return null;
    const e = this.add();
    return e !== null && this.pos === this.toks.length ? e : null;
  }

  private peek(): Token | undefined {
    return this.toks[this.pos];
  }
  private isOp(text: string): boolean {
    const t = this.peek();
    return t !== undefined && t.kind === "op" && t.text === text;
  }
  private startsOperand(): boolean {
    const t = this.peek();
    return t !== undefined && (t.kind !== "op" || t.text === "(");
  }

  private add(): MathJson | null {
    let left = this.mul();
    while (left !== null && (this.isOp("+") || this.isOp("-"))) {
      const op = this.isOp("+") ? "Add" : "Subtract";
      this.pos += 1;
      const right = this.mul();
      if (right === null) return null;
      left = [op, left, right];
    }
    return left;
  }

  private mul(): MathJson | null {
    let left = this.unary();
    while (left !== null) {
      if (this.isOp("*") || this.isOp("/")) {
        const op = this.isOp("*") ? "Multiply" : "Divide";
        this.pos += 1;
        const right = this.unary();
        if (right === null) return null;
        left = [op, left, right];
      } else if (this.startsOperand()) {
        const right = this.power(); // implicit multiplication never takes a sign
        if (right === null) return null;
        left = ["Multiply", left, right];
      } else {
        break;
      }
    }
    return left;
  }

  private unary(): MathJson | null {
    if (this.isOp("-") || this.isOp("+")) {
      const negate = this.isOp("-");
      this.pos += 1;
      const operand = this.unary();
      if (operand === null) return null;
      return negate ? ["Negate", operand] : operand;
    }
    return this.power();
  }

  private power(): MathJson | null {
    const base = this.postfix();
    if (base === null || !this.isOp("**")) return base;
    this.pos += 1;
    const exponent = this.unary(); // right-associative, may carry a sign: 2**-1
    return exponent === null ? null : ["Power", base, exponent];
  }

  private postfix(): MathJson | null {
    let e = this.atom();
    while (e !== null && this.isOp("!")) {
      this.pos += 1;
      if (this.isOp("!")) return null; // `!!` is sympy's double factorial: not modelled
      e = ["Factorial", e];
    }
    return e;
  }

  private atom(): MathJson | null {
    const t = this.peek();
    if (t === undefined) return null;
    this.pos += 1;
    switch (t.kind) {
      case "num":
        return numberJson(t.text);
      case "sym":
        return symbolName(t.name);
      case "const":
        return t.name;
      case "func": {
        if (!this.isOp("(")) return null;
        const arg = this.atom();
        return arg === null ? null : [t.name, arg];
      }
      case "op": {
        if (t.text !== "(") return null;
        const inner = this.add();
        if (inner === null || !this.isOp(")")) return null;
        this.pos += 1;
        return inner;
      }
    }
  }
}

/** The sympy-text expression as MathJSON, or null where sympy would not parse it. */
export function parseSympyText(text: string): MathJson | null {
  const toks = tokenize(text.replaceAll("^", "**")); // slime's _sympy_parse does the same replacement
  return toks === null ? null : new Parser(toks).parse();
}
