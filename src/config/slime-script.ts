/**
 * Reads the command line out of a slime launch script (THUDM/slime
 * scripts/run-*.sh): bash arrays `NAME=( ... )`, continuation lines, comments,
 * `source`d model files, and the `python3 train.py ... ${NAME[@]}` line that
 * splices them together. Only what is needed to recover train.py's argv: no
 * command is run, so `${VAR}` and `$(cmd)` stay as written.
 */

export interface SlimeScript {
  /** train.py's arguments, arrays spliced in (or every *_ARGS array in order when no train.py line is found). */
  args: string[];
  /** Array references the script splices but never defines (e.g. from a file it could not source). */
  unresolved: string[];
  /** Files named by `source` that could not be read. */
  unsourced: string[];
}

/** Split one line into shell words: quotes removed, `${VAR}`/`$(cmd)` kept verbatim, `#` starts a comment. */
export function shellWords(line: string): string[] {
  const words: string[] = [];
  let cur = "";
  let inWord = false;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i] as string;
    if (/\s/.test(ch)) {
      if (inWord) words.push(cur);
      cur = "";
      inWord = false;
      continue;
    }
    if (ch === "#" && !inWord) break;
    inWord = true;
    if (ch === "\\" && i + 1 < line.length) {
      cur += line[++i];
    } else if (ch === "'") {
      const end = line.indexOf("'", i + 1);
      const stop = end === -1 ? line.length : end;
      cur += line.slice(i + 1, stop);
      i = stop;
    } else if (ch === '"') {
      let j = i + 1;
      while (j < line.length && line[j] !== '"') {
        if (line[j] === "\\" && j + 1 < line.length) {
          cur += line[j + 1];
          j += 2;
          continue;
        }
        cur += line[j];
        j++;
      }
      i = j;
    } else if (ch === "$" && line[i + 1] === "(") {
      let depth = 0;
      let j = i + 1;
      for (; j < line.length; j++) {
        if (line[j] === "(") depth++;
        else if (line[j] === ")" && --depth === 0) break;
      }
      cur += line.slice(i, j + 1);
      i = j;
    } else {
      cur += ch;
    }
  }
  if (inWord) words.push(cur);
  return words;
}

/** Join `\`-continued lines into one. */
function logicalLines(text: string): string[] {
  return text.replace(/\r\n/g, "\n").replace(/\\\n/g, " ").split("\n");
}

const arrayRef = /^\$\{([A-Za-z_]\w*)\[@\]\}$|^\$([A-Za-z_]\w*)\[@\]$/;
const arrayStart = /^\s*([A-Za-z_]\w*)=\((.*)$/;
const sourceLine = /^\s*(?:source|\.)\s+(.+)$/;
const trainLine = /(?:^|\s|\/)(train(?:_async)?\.py)(?:\s|$)/;

/**
 * Parse `text`; `readSourced(path)` returns a sourced file's text or null
 * (`${SCRIPT_DIR}` and `$(dirname ...)` forms are the caller's to resolve).
 */
export function parseSlimeScript(text: string, readSourced: (path: string) => string | null = () => null): SlimeScript {
  const arrays = new Map<string, string[]>();
  const order: string[] = [];
  const unsourced: string[] = [];
  let command: string[] | null = null;

  const scan = (src: string, depth: number): void => {
    const lines = logicalLines(src);
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i] as string;
      if (/^\s*#/.test(line)) continue;
      const arr = arrayStart.exec(line);
      if (arr) {
        const name = arr[1] as string;
        const words: string[] = [];
        let rest = arr[2] as string;
        for (;;) {
          const w = shellWords(rest);
          const close = w.indexOf(")");
          const closeInline = close === -1 && w.length > 0 && (w[w.length - 1] as string).endsWith(")") && !(w[w.length - 1] as string).startsWith("$(");
          if (close !== -1) {
            words.push(...w.slice(0, close));
            break;
          }
          if (closeInline) {
            words.push(...w.slice(0, -1), (w[w.length - 1] as string).slice(0, -1));
            break;
          }
          words.push(...w);
          if (++i >= lines.length) break;
          rest = lines[i] as string;
        }
        if (!arrays.has(name)) order.push(name);
        arrays.set(
          name,
          words.filter((w) => w !== ""),
        );
        continue;
      }
      const src2 = sourceLine.exec(line);
      if (src2 && depth < 4) {
        const target = shellWords(src2[1] as string)[0] ?? "";
        const body = readSourced(target);
        if (body === null) unsourced.push(target);
        else scan(body, depth + 1);
        continue;
      }
      if (command === null && trainLine.test(line)) {
        const words = shellWords(line);
        const at = words.findIndex((w) => /(?:^|\/)train(?:_async)?\.py$/.test(w));
        if (at !== -1) command = words.slice(at + 1);
      }
    }
  };
  scan(text, 0);

  const unresolved: string[] = [];
  const source = command ?? order.filter((n) => n.endsWith("_ARGS")).map((n) => `\${${n}[@]}`);
  const args: string[] = [];
  for (const w of source) {
    const m = arrayRef.exec(w);
    if (!m) {
      args.push(w);
      continue;
    }
    const name = (m[1] ?? m[2]) as string;
    const arr = arrays.get(name);
    if (arr === undefined) unresolved.push(name);
    else args.push(...arr);
  }
  return { args, unresolved, unsourced };
}
