import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { parseArgs } from "node:util";
import { stringify } from "yaml";
import { applyOverrides, readConfigFile } from "../config/load.ts";
import { ConfigError, parseRunConfig } from "../config/run-config.ts";
import { checkConfig } from "../config/config-check.ts";
import { parseSlimeScript } from "../config/slime-script.ts";
import { formatImportReport, importedYaml, importSlimeArgs } from "../config/slime-import.ts";

export interface Out {
  stdout: (s: string) => void;
  stderr: (s: string) => void;
}
const processOut: Out = { stdout: (s) => process.stdout.write(s), stderr: (s) => process.stderr.write(s) };

/** `rlq config import-slime ...` and `rlq config check FILE`. Returns the exit code. */
export async function configCommand(argv: readonly string[], out: Out = processOut): Promise<number> {
  const [sub, ...rest] = argv;
  switch (sub) {
    case "import-slime":
      return importSlime(rest, out);
    case "check":
      return check(rest, out);
    default:
      throw new ConfigError(`rlq config ${sub ?? ""}: expected import-slime or check (rlq help config)`);
  }
}

/**
 * `import-slime SCRIPT.sh [-o run.yaml]` reads a launch script;
 * `import-slime --flag value ... [-o run.yaml]` reads train.py's flags directly
 * (slime's flags pass through untouched, so -o must come first or last).
 * Exit 0 only when the report says `validation: ok`: the config validates and
 * nothing that changes what the run does was dropped; otherwise 2.
 */
function importSlime(argv: readonly string[], out: Out): number {
  const args = [...argv];
  let output: string | null = null;
  for (const flag of ["-o", "--output"]) {
    const at = args.indexOf(flag);
    if (at !== -1) {
      output = args[at + 1] ?? null;
      if (output === null) throw new ConfigError(`rlq config import-slime: ${flag} needs a file name`);
      args.splice(at, 2);
    }
  }
  if (args.length === 0)
    throw new ConfigError("rlq config import-slime: expected a slime launch script (SCRIPT.sh) or train.py's flags (--rollout-batch-size 32 ...)");
  let flags: string[];
  let unresolved: string[] = [];
  let source: string;
  // --custom-config-path is relative to where slime was launched: the script's directory, else here.
  let baseDirs = [process.cwd()];
  if (args.length === 1 && !(args[0] as string).startsWith("--")) {
    const script = resolve(args[0] as string);
    let text: string;
    try {
      text = readFileSync(script, "utf8");
    } catch (e) {
      throw new ConfigError(`rlq config import-slime: cannot read ${args[0]}: ${(e as Error).message}`);
    }
    const dir = dirname(script);
    const parsed = parseSlimeScript(text, (p) => {
      const file = resolve(dir, p.replace(/^\$\{SCRIPT_DIR\}|^\$SCRIPT_DIR/, dir));
      return existsSync(file) ? readFileSync(file, "utf8") : null;
    });
    flags = parsed.args;
    unresolved = parsed.unresolved;
    source = args[0] as string;
    baseDirs = [dir, process.cwd()];
    for (const f of parsed.unsourced) out.stderr(`warning: could not read the sourced file ${f}\n`);
  } else {
    flags = args;
    source = "train.py flags";
  }
  const readFile = (p: string): string | null => {
    for (const base of baseDirs) {
      const file = resolve(base, p);
      if (existsSync(file)) return readFileSync(file, "utf8");
    }
    return null;
  };
  const { config, report } = importSlimeArgs(flags, { readFile }, unresolved);
  const yaml = importedYaml(config, source);
  if (output === null) out.stdout(yaml);
  else writeFileSync(output, yaml);
  out.stderr(formatImportReport(report));
  return report.isOk ? 0 : 2;
}

/** Validate FILE (with --set overrides), print the effective config and warn of keys that do nothing. */
async function check(argv: readonly string[], out: Out): Promise<number> {
  const { values, positionals } = parseArgs({
    args: [...argv],
    allowPositionals: true,
    options: { set: { type: "string", multiple: true }, json: { type: "boolean" } },
  });
  const file = positionals[0];
  if (!file) throw new ConfigError("rlq config check: expected a config file, e.g. rlq config check run.yaml");
  const raw = applyOverrides(await readConfigFile(file), values.set ?? []);
  const config = parseRunConfig(raw, file, "user");
  const warnings = checkConfig(raw, config);
  out.stdout(
    values.json
      ? JSON.stringify({ config, warnings }, null, 2) + "\n"
      : `# ${file}: valid. Effective config (defaults filled in):\n${stringify(config, { lineWidth: 0 })}`,
  );
  for (const w of warnings) out.stderr(`warning: ${w.message}\n`);
  return 0;
}
