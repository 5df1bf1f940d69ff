/**
 * The few Python built-ins whose exact behaviour slime's graders and filters
 * depend on, written out for JavaScript numbers and strings.
 *
 * Why this exists: a grader ported with `Number()` instead of `float()`, or
 * `Math.round` instead of `round()`, agrees with slime on easy cases and
 * silently disagrees on the rest (`float("1_000")`, `round(2.5)`,
 * `str(1e16)`), which flips rewards without any crash.
 */

const PY_FLOAT_LITERAL = /^[+-]?(?:(?:\d(?:_?\d)*)(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?$/;
const PY_FLOAT_SPECIAL = /^[+-]?(?:inf|infinity|nan)$/i;

/**
 * Python's `float(s)` for a str: surrounding whitespace allowed, `_` between
 * digits, `inf`/`nan` in any case. Returns null where Python raises ValueError.
 */
export function pyFloat(s: string): number | null {
  const t = s.trim();
  if (PY_FLOAT_LITERAL.test(t)) return Number(t.replace(/_/g, ""));
  if (PY_FLOAT_SPECIAL.test(t)) {
    const neg = t.startsWith("-");
    if (/nan/i.test(t)) return Number.NaN;
    return neg ? -Infinity : Infinity;
  }
  return null;
}

/**
 * Python's `round(x)` with no ndigits: round half to even. Returns null where
 * Python raises (inf: OverflowError, nan: ValueError).
 */
export function pyRoundToInt(x: number): number | null {
  if (!Number.isFinite(x)) return null;
  const f = Math.floor(x);
  const diff = x - f;
  if (diff < 0.5) return f;
  if (diff > 0.5) return f + 1;
  return f % 2 === 0 ? f : f + 1;
}

/** Python's `str(int(x))` for a finite float: truncation toward zero, every digit. */
export function pyIntStr(x: number): string {
  return BigInt(Math.trunc(x)).toString();
}

/** Exact value of a finite double as `mantissa * 2^exponent` (both integers). */
function decomposeDouble(x: number): { mantissa: bigint; exponent: number } {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const hi = view.getUint32(0);
  const lo = view.getUint32(4);
  const sign = hi >>> 31 === 1 ? -1n : 1n;
  const biased = (hi >>> 20) & 0x7ff;
  let mantissa = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  let exponent: number;
  if (biased === 0) {
    exponent = -1074;
  } else {
    mantissa |= 1n << 52n;
    exponent = biased - 1075;
  }
  return { mantissa: sign * mantissa, exponent };
}

/**
 * Python's `round(x, ndigits)` for a float: the exact binary value rounded to
 * `ndigits` decimals, ties to even, then the nearest double. So
 * `round(0.25, 1) == 0.2` and `round(0.35, 1) == 0.3` (0.35 is stored as
 * 0.34999…), where `toFixed` would give 0.3 and 0.3, and `Math.round(x*10)/10`
 * gives 0.3 and 0.4.
 */
export function pyRound(x: number, ndigits: number): number {
  if (!Number.isFinite(x) || x === 0) return x;
  const { mantissa, exponent } = decomposeDouble(x);
  // value * 10^n = mantissa * 2^exponent * 10^n = num / den
  let num = mantissa * 10n ** BigInt(Math.max(ndigits, 0));
  let den = 10n ** BigInt(Math.max(-ndigits, 0));
  if (exponent >= 0) num <<= BigInt(exponent);
  else den <<= BigInt(-exponent);
  const negative = num < 0n;
  const absNum = negative ? -num : num;
  let q = absNum / den;
  const r2 = (absNum % den) * 2n;
  if (r2 > den || (r2 === den && q % 2n === 1n)) q += 1n;
  const signed = negative ? -q : q;
  const result = Number(`${signed}e${-ndigits}`);
  // Python keeps the sign of a zero result: round(-0.04, 1) is -0.0.
  return result === 0 && negative ? -0 : result;
}

/**
 * Python's `repr(float)` (which `str()` also uses): shortest round-trip
 * digits, fixed notation for exponents -4..15, otherwise `1e-05` / `1.5e+16`,
 * and always a `.0` on integral values in fixed notation.
 */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (x === Infinity) return "inf";
  if (x === -Infinity) return "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [mant = "", expText = "0"] = Math.abs(x).toExponential().split("e");
  const digits = mant.replace(".", "");
  const exp = Number(expText);
  if (exp < -4 || exp >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    const e = Math.abs(exp).toString().padStart(2, "0");
    return `${sign}${m}e${exp < 0 ? "-" : "+"}${e}`;
  }
  if (exp < 0) return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
  const intPart = digits.slice(0, exp + 1).padEnd(exp + 1, "0");
  const frac = digits.slice(exp + 1);
  return `${sign}${intPart}.${frac === "" ? "0" : frac}`;
}

/**
 * Python's `str(value)` for the JSON scalars a dataset label can hold.
 * JSON has one number type, so an integer-valued number is printed as a
 * Python int (`42`, not `42.0`): a JSONL label `42.0` reaches us as 42.
 */
export function pyStr(value: unknown): string {
  if (typeof value === "string") return value;
  if (typeof value === "number") return Number.isInteger(value) ? BigInt(value).toString() : pyFloatRepr(value);
  if (typeof value === "boolean") return value ? "True" : "False";
  if (value === null || value === undefined) return "None";
  return JSON.stringify(value);
}

/** Python truthiness of a JSON value (`not label`). NaN is truthy in Python. */
export function pyIsFalsy(value: unknown): boolean {
  if (value === null || value === undefined || value === false || value === 0 || value === "") return true;
  if (Array.isArray(value)) return value.length === 0;
  if (typeof value === "object") return Object.keys(value).length === 0;
  return false;
}

/** Python's `str.isalpha()` for one character: Unicode letter categories L*. */
export function pyIsAlphaChar(ch: string): boolean {
  return /^\p{L}$/u.test(ch);
}

/** Python's `str.isdigit()`: non-empty and every character a digit. */
export function pyIsDigitString(s: string): boolean {
  return /^[\p{Nd}\u00b2\u00b3\u00b9\u2070-\u2079\u2080-\u2089]+$/u.test(s);
}

/** Python `s[-n:]`: the last n code points (not UTF-16 units). */
export function pyTailCodePoints(s: string, n: number): string {
  const cps = Array.from(s);
  return cps.length <= n ? s : cps.slice(cps.length - n).join("");
}

/**
 * Python's `int(s)` for a str (base 10): whitespace, a sign and `_` between
 * digits allowed. Returns null where Python raises.
 */
export function pyInt(s: string): bigint | null {
  const t = s.trim();
  if (!/^[+-]?\d(?:_?\d)*$/.test(t)) return null;
  return BigInt(t.replace(/_/g, ""));
}
