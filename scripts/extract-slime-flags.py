"""Every command-line flag slime's train.py declares, as JSON, for src/config/slime-flags.test.ts.

slime parses its flags in three places, and all three are read here with `ast` (nothing is imported,
so neither slime nor SGLang needs to be installed):

- slime/utils/arguments.py: `parser.add_argument(...)` and `reset_arg(parser, "--flag", ...)` (a flag
  Megatron lacks is added), plus the pre-parser of `--train-backend` and the debug modes;
- slime/backends/sglang_utils/arguments.py: its own flags, `RouterArgs.add_cli_args(parser,
  use_router_prefix=True, exclude_host_port=True)` (the router's flags as `--router-*`, read from
  sglang_router/router_args.py), and `ServerArgs.add_cli_args` wrapped so that every flag becomes
  `--sglang-*` and the names in `skipped_args` are left out (read from sglang/srt/server_args.py:
  `A[T, Arg(...)]` / `A[T, "help"]` dataclass fields and the explicit `parser.add_argument` calls).

Usage (the versions are those slime pins: build_conda.sh and docker/Dockerfile at the slime commit):

    git -C SLIME show COMMIT:slime/utils/arguments.py > /tmp/arguments.py
    git -C SLIME show COMMIT:slime/backends/sglang_utils/arguments.py > /tmp/sglang_arguments.py
    pip download sglang==0.5.15.post1 sglang-router==0.3.2 --no-deps -d /tmp/wheels  # unzip the two files
    python scripts/extract-slime-flags.py --slime-commit COMMIT \\
        --slime-arguments /tmp/arguments.py --slime-sglang-arguments /tmp/sglang_arguments.py \\
        --sglang-server-args /tmp/wheels/sglang/srt/server_args.py --sglang-version 0.5.15.post1 \\
        --router-args /tmp/wheels/sglang_router/router_args.py --router-version 0.3.2 \\
        > test/fixtures/slime-flags-COMMIT.json
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path


def _str(node: ast.AST, prefix: str = "") -> str | None:
    """A string literal, or an f-string `f"--{prefix}name"` with the router's prefix substituted."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = ""
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                out += part.value
            elif (
                isinstance(part, ast.FormattedValue)
                and isinstance(part.value, ast.Name)
                and part.value.id == "prefix"
            ):
                out += prefix
            else:
                return None
        return out
    return None


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _long_flags(call: ast.Call, first: int, prefix: str = "") -> list[str]:
    names = [_str(a, prefix) for a in call.args[first:]]
    return [n for n in names if n is not None and n.startswith("--")]


def _calls(tree: ast.AST, func_names: set[str]) -> list[ast.Call]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = (
            f.attr
            if isinstance(f, ast.Attribute)
            else f.id
            if isinstance(f, ast.Name)
            else None
        )
        if name in func_names:
            out.append(node)
    return out


def slime_flags(path: Path, source: str) -> list[dict]:
    """add_argument / reset_arg calls with literal long flags (the router and ServerArgs wrappers pass none)."""
    tree = ast.parse(path.read_text())
    out = []
    for call in _calls(tree, {"add_argument", "reset_arg"}):
        is_reset = isinstance(call.func, ast.Name) and call.func.id == "reset_arg"
        flags = _long_flags(call, 1 if is_reset else 0)
        if flags:
            out.append({"flag": flags[0], "aliases": flags[1:], "source": source})
    return out


def router_flags(path: Path) -> list[dict]:
    """RouterArgs.add_cli_args(use_router_prefix=True, exclude_host_port=True): host/port left out."""
    tree = ast.parse(path.read_text())
    cls = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.name == "RouterArgs"
    )
    fn = next(
        n
        for n in cls.body
        if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"
    )
    out = []
    for call in _calls(fn, {"add_argument"}):
        flags = _long_flags(call, 0, prefix="router-")
        if flags and flags[0] not in ("--host", "--port"):
            out.append(
                {
                    "flag": flags[0],
                    "aliases": flags[1:],
                    "source": "sglang_router/router_args.py",
                }
            )
    return out


def _arg_meta(annotation: ast.AST) -> ast.AST | None:
    """The metadata of `A[T, meta]` / `Annotated[T, meta]`, or None."""
    if not isinstance(annotation, ast.Subscript):
        return None
    base = annotation.value
    if not (isinstance(base, ast.Name) and base.id in ("A", "Annotated")):
        return None
    elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else []
    return elts[1] if len(elts) >= 2 else None


def server_args_flags(path: Path, skipped: set[str]) -> list[dict]:
    """ServerArgs's CLI flags as slime registers them: `--sglang-` prefixed, `skipped_args` left out."""
    tree = ast.parse(path.read_text())
    cls = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
    )
    entries: list[tuple[list[str], str]] = []
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        meta = _arg_meta(node.annotation)
        if meta is None:
            continue
        field = node.target.id
        cli_name, aliases = "--" + field.replace("_", "-"), []
        if isinstance(meta, ast.Call):
            if (
                isinstance(_kw(meta, "no_cli"), ast.Constant)
                and _kw(meta, "no_cli").value is True
            ):
                continue
            cli = _kw(meta, "cli_name")
            cli_name = _str(cli) if cli is not None else cli_name
            al = _kw(meta, "aliases")
            aliases = [_str(e) for e in al.elts] if isinstance(al, ast.List) else []
        elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
            continue
        auto_dest = cli_name.lstrip("-").replace("-", "_")
        # slime's wrapper checks `dest` when given (add_cli_args_from_dataclass passes the field name then).
        canonical = field if field != auto_dest else auto_dest
        entries.append(([cli_name, *[a for a in aliases if a]], canonical))
    fn = next(
        n
        for n in cls.body
        if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"
    )
    for call in _calls(fn, {"add_argument"}):
        flags = _long_flags(call, 0)
        if not flags:
            continue
        dest = _kw(call, "dest")
        canonical = _str(dest) if dest is not None else flags[0][2:].replace("-", "_")
        entries.append((flags, canonical or ""))
    out = []
    for flags, canonical in entries:
        if canonical in skipped:
            continue
        pref = ["--sglang-" + f.lstrip("-") for f in flags]
        out.append(
            {
                "flag": pref[0],
                "aliases": pref[1:],
                "source": "sglang/srt/server_args.py (prefixed by slime)",
            }
        )
    return out


def skipped_args(path: Path) -> set[str]:
    """slime's `skipped_args` list in add_sglang_arguments."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "skipped_args" for t in node.targets
        ):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    raise SystemExit(f"{path}: no skipped_args list found")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in (
        "slime-commit",
        "slime-arguments",
        "slime-sglang-arguments",
        "sglang-server-args",
        "sglang-version",
        "router-args",
        "router-version",
    ):
        p.add_argument(f"--{name}", required=True)
    a = p.parse_args()
    flags = [
        *slime_flags(Path(a.slime_arguments), "slime/utils/arguments.py"),
        *slime_flags(
            Path(a.slime_sglang_arguments), "slime/backends/sglang_utils/arguments.py"
        ),
        *router_flags(Path(a.router_args)),
        *server_args_flags(
            Path(a.sglang_server_args), skipped_args(Path(a.slime_sglang_arguments))
        ),
    ]
    seen: dict[str, dict] = {}
    for f in flags:
        seen.setdefault(f["flag"], f)
    out = {
        "slime_commit": a.slime_commit,
        "sglang_version": a.sglang_version,
        "sglang_router_version": a.router_version,
        "count": len(seen),
        "flags": sorted(seen.values(), key=lambda f: f["flag"]),
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
