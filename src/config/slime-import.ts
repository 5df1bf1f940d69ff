import { stringify } from "yaml";
import { ConfigError, parseRunConfig, runConfigSchema } from "./run-config.ts";
import { classifySlimeFlag, dropGroupTitles, flagToKey, slimeBuiltinDefaults, type DropGroup } from "./slime-flags.ts";

/**
 * slime's train.py argv → an rlq run config and a report of what became of
 * every flag (`rlq config import-slime`). Source read: THUDM/slime 624b824,
 * slime/utils/arguments.py (names, defaults, negative flags) and
 * scripts/run-*.sh (how the flags are passed).
 */

export interface ImportReport {
  mapped: Array<{ flag: string; key: string; value: unknown }>;
  renamed: Array<{ flag: string; key: string; value: unknown; note: string }>;
  dropped: Partial<Record<DropGroup, string[]>>;
  unsupported: Array<{ flag: string; why: string }>;
  /** Keys rlq needs that slime's flags do not give, or slime defaults that differ from rlq's. */
  added: Array<{ key: string; value: unknown; why: string }>;
  /** Values left as written because they expand an environment variable or a command. */
  unexpanded: Array<{ key: string; value: string }>;
  unresolved: string[];
  /** null: the config validates; otherwise the validation errors. */
  validation: string | null;
}

const rlqKeys = new Set(Object.keys(runConfigSchema.shape));
const shape = runConfigSchema.shape as Record<string, { safeParse(v: unknown): { success: boolean } }>;

/** slime's --custom-tis-function-path values → rlq's tis_function (slime/backends/megatron_utils/loss.py, examples/train_infer_mismatch_helper/mis.py). */
function tisFunctionFor(path: string): "vanilla" | "icepop" | "mis" | null {
  if (/vanilla_tis_function$/.test(path)) return "vanilla";
  if (/icepop_function$/.test(path)) return "icepop";
  if (/mis\.compute_mis_weights(_with_cp)?$/.test(path)) return "mis";
  return null;
}

const hasExpansion = (v: string) => /\$\{?[A-Za-z_(]/.test(v);

/** The first reading of the flag's words that the rlq key accepts: bare flag → true, one word → number or string, several → a list. */
function convertValue(key: string, words: readonly string[]): unknown {
  const field = shape[key];
  const candidates: unknown[] =
    words.length === 0
      ? [true]
      : words.length === 1
        ? [Number(words[0]), words[0] === "true" ? true : words[0] === "false" ? false : undefined, words[0], [Number(words[0])], [words[0]]]
        : [words.map(Number), words];
  for (const c of candidates) {
    if (c === undefined || (typeof c === "number" && Number.isNaN(c))) continue;
    if (field?.safeParse(c).success) return c;
  }
  return words.length === 0 ? true : words.length === 1 ? words[0] : [...words];
}

/** Split argv into flags with their values (`-1` and other non-`--` words are values). */
function flagsOf(args: readonly string[]): Array<{ flag: string; words: string[] }> {
  const out: Array<{ flag: string; words: string[] }> = [];
  for (const a of args) {
    if (a.startsWith("--")) {
      const eq = a.indexOf("=");
      out.push(eq === -1 ? { flag: a, words: [] } : { flag: a.slice(0, eq), words: [a.slice(eq + 1)] });
    } else if (out.length > 0) {
      (out[out.length - 1] as { words: string[] }).words.push(a);
    }
  }
  return out;
}

export interface ImportOptions {
  /** Engine URL written when the script names none (slime launches SGLang itself). */
  engineUrl?: string;
  /** Remote trainer URL written (slime trains with Megatron in-process; rlq's GPU trainer is workers/trainer-torch). */
  trainerUrl?: string;
}

export function importSlimeArgs(
  args: readonly string[],
  options: ImportOptions = {},
  unresolved: readonly string[] = [],
): { config: Record<string, unknown>; report: ImportReport } {
  const config: Record<string, unknown> = {};
  const report: ImportReport = {
    mapped: [],
    renamed: [],
    dropped: {},
    unsupported: [],
    added: [],
    unexpanded: [],
    unresolved: [...unresolved],
    validation: null,
  };
  let routerIp: string | null = null;
  let routerPort: string | null = null;
  for (const { flag, words } of flagsOf(args)) {
    const key = flagToKey(flag);
    const shown = words.length === 0 ? flag : `${flag} ${words.join(" ")}`;
    if (slimeBuiltinDefaults[key] !== undefined && words.length === 1 && words[0] === slimeBuiltinDefaults[key]) {
      report.renamed.push({ flag: shown, key: "(built in)", value: null, note: "slime's default implementation, which is rlq's own" });
      continue;
    }
    const d = classifySlimeFlag(key, rlqKeys);
    if (d.kind === "dropped" && key === "optimizer" && words[0] !== undefined && words[0] !== "adam") {
      report.unsupported.push({ flag: shown, why: `rlq's trainers use Adam(W), not ${words[0]}` });
      continue;
    }
    if (d.kind === "dropped") {
      (report.dropped[d.group] ??= []).push(shown);
      continue;
    }
    if (d.kind === "unsupported") {
      report.unsupported.push({ flag: shown, why: d.why });
      continue;
    }
    if (d.kind === "same") {
      const value = key === "eval_prompt_data" ? pairs(words) : convertValue(key, words);
      config[key] = value;
      report.mapped.push({ flag: shown, key, value });
      for (const w of words) if (hasExpansion(w)) report.unexpanded.push({ key, value: w });
      continue;
    }
    // renamed
    let value: unknown = d.value;
    switch (key) {
      case "custom_tis_function_path": {
        value = tisFunctionFor(words[0] ?? "");
        if (value === null) {
          report.unsupported.push({ flag: shown, why: "a custom TIS function: rlq has vanilla, icepop and mis (tis_function)" });
          continue;
        }
        break;
      }
      case "sglang_router_ip":
        routerIp = words[0] ?? null;
        break;
      case "sglang_router_port":
        routerPort = words[0] ?? null;
        break;
      case "rollout_external_engine_addrs":
        value = words.map((w) => (/^https?:\/\//.test(w) ? w : `http://${w}`));
        config.engine = { kind: "sglang", urls: value };
        break;
      default:
        if (value === undefined) value = words.length === 1 ? words[0] : words;
    }
    if (!d.key.startsWith("engine.")) config[d.key] = value;
    report.renamed.push({ flag: shown, key: d.key, value: value ?? words[0], note: d.note });
  }
  if (config.engine === undefined) {
    const router = routerIp !== null ? `http://${routerIp}:${routerPort ?? "30000"}` : null;
    const url = options.engineUrl ?? "http://127.0.0.1:30000";
    config.engine = router !== null ? { kind: "sglang", router_url: router } : { kind: "sglang", urls: [url] };
    if (router === null)
      report.added.push({
        key: "engine",
        value: config.engine,
        why: "slime launches SGLang itself; rlq connects to a server you start: put its URL here (SGLang's default port)",
      });
  }
  config.trainer = { kind: "remote", url: options.trainerUrl ?? "http://127.0.0.1:8700" };
  report.added.push({
    key: "trainer",
    value: config.trainer,
    why: "slime trains with Megatron in-process; rlq's GPU trainer is a server (workers/trainer-torch, default port 8700)",
  });
  // Where slime's (Megatron's) default differs from rlq's, write slime's so the run means the same.
  const slimeDefaults: Array<[string, unknown, string]> = [
    ["lr_decay_style", "linear", "Megatron's default (rlq's is constant)"],
    ["weight_decay", 0.01, "Megatron's default (rlq's is 0)"],
    ["label_key", null, "slime's default: no label (rlq's is 'label')"],
  ];
  for (const [key, value, why] of slimeDefaults) {
    if (key in config) continue;
    config[key] = value;
    report.added.push({ key, value, why });
  }
  if (typeof config.hf_checkpoint === "string" && config.tokenizer === undefined) {
    config.tokenizer = "hf";
    report.added.push({ key: "tokenizer", value: "hf", why: "slime's rollout tokenizes with --hf-checkpoint's tokenizer" });
  }
  try {
    parseRunConfig(config, "imported config", "user");
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    report.validation = e.message;
  }
  return { config, report };
}

function pairs(words: readonly string[]): unknown {
  if (words.length % 2 !== 0) return words.join(" ");
  return Object.fromEntries(Array.from({ length: words.length / 2 }, (_, i) => [words[2 * i], words[2 * i + 1]]));
}

/** The run config as YAML, headed by where it came from. */
export function importedYaml(config: Record<string, unknown>, source: string): string {
  return `# Imported from ${source} by rlq config import-slime; read the report before running.\n${stringify(config, { lineWidth: 0 })}`;
}

/** The human report: mapped, renamed, dropped (grouped), unsupported (with why), added, validation. */
export function formatImportReport(r: ImportReport): string {
  const out: string[] = [];
  const show = (v: unknown) => (typeof v === "string" ? v : JSON.stringify(v));
  out.push(`mapped (${r.mapped.length}): same name and meaning in rlq`);
  for (const m of r.mapped) out.push(`  ${m.flag}  ->  ${m.key}: ${show(m.value)}`);
  out.push(`renamed (${r.renamed.length}):`);
  for (const m of r.renamed) out.push(`  ${m.flag}  ->  ${m.key}: ${show(m.value)}  (${m.note})`);
  const groups = Object.entries(r.dropped) as Array<[DropGroup, string[]]>;
  out.push(`dropped (${groups.reduce((n, [, v]) => n + v.length, 0)}):`);
  for (const [g, flags] of groups) {
    out.push(`  ${dropGroupTitles[g]}:`);
    for (const f of flags) out.push(`    ${f}`);
  }
  out.push(`unsupported (${r.unsupported.length}):`);
  for (const u of r.unsupported) out.push(`  ${u.flag}: ${u.why}`);
  out.push(`written by rlq (${r.added.length}):`);
  for (const a of r.added) out.push(`  ${a.key}: ${show(a.value)}  (${a.why})`);
  if (r.unexpanded.length > 0) {
    out.push(`left as written (${r.unexpanded.length}): expand these before rlq run start`);
    for (const u of r.unexpanded) out.push(`  ${u.key}: ${u.value}`);
  }
  if (r.unresolved.length > 0)
    out.push(`unresolved arrays (${r.unresolved.length}): ${r.unresolved.join(", ")} (defined in a file the script sources that could not be read)`);
  out.push(r.validation === null ? "validation: ok" : `validation: FAILED\n${r.validation.replace(/^/gm, "  ")}`);
  return out.join("\n") + "\n";
}
