import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

_TERMINAL = {"completed", "cancelled", "failed"}
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


class RlqCommandError(RuntimeError):
    """An `rlq` command that exited non-zero: its argv, exit code and stderr."""

    def __init__(self, argv: Sequence[str], code: int, stderr: str):
        self.argv = list(argv)
        self.code = code
        self.stderr = stderr
        super().__init__(
            f"{' '.join(argv)} exited with code {code}: {stderr.strip()[-2000:]}"
        )


class Rlq:
    """The `rlq` command, with an environment (DATABASE_URL, REDIS_URL, ...).

    command: how to run rlq, e.g. ["rlq"] (default: `rlq` on PATH) or
    ["node", "/path/to/rlq/bin/rlq.js"] for a checkout.
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
    ):
        if command is None:
            found = shutil.which("rlq")
            if found is None:
                raise FileNotFoundError(
                    "no `rlq` on PATH: install rlq (npm install -g rlq) or pass command=['node', '/path/to/rlq/bin/rlq.js']"
                )
            command = [found]
        self.command = list(command)
        self.env = {**os.environ, **(env or {})}
        self.cwd = str(cwd) if cwd is not None else None

    def _run(self, args: Sequence[str], timeout: float | None = None) -> str:
        argv = [*self.command, *args]
        r = subprocess.run(
            argv,
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise RlqCommandError(argv, r.returncode, r.stderr)
        return r.stdout

    def start(
        self,
        config: Mapping[str, Any] | str | os.PathLike,
        name: str | None = None,
        sets: Iterable[str] = (),
        base_dir: str | os.PathLike | None = None,
    ) -> "Run":
        """Record a new run from a config file or dict; returns it (not yet driven: see Run.wait).

        A dict's relative paths are relative to base_dir (default: the client's cwd), as a
        config file's are relative to the file.
        """
        extra = [
            *(["--name", name] if name else []),
            *[a for s in sets for a in ("--set", s)],
        ]
        if isinstance(config, Mapping):
            directory = Path(base_dir or self.cwd or os.getcwd())
            fd, path = tempfile.mkstemp(
                prefix=".rlq-config-", suffix=".json", dir=directory
            )
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(dict(config), f)
                out = self._run(["run", "start", "--config", path, *extra])
            finally:
                os.unlink(path)
        else:
            out = self._run(["run", "start", "--config", str(config), *extra])
        run_id = out.strip().splitlines()[-1].strip()
        return Run(self, run_id)

    def run(self, run_id: str) -> "Run":
        return Run(self, run_id)

    def sql(self, query: str, limit: int = 1000) -> list[dict[str, Any]]:
        """One read-only statement through the reader role (`rlq sql --json`)."""
        return json.loads(self._run(["sql", query, "--json", "--limit", str(limit)]))


class Run:
    def __init__(self, client: Rlq, run_id: str):
        self.client = client
        self.id = run_id

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    def status(self) -> dict[str, Any]:
        """The run's status report (`rlq run status ID --json`): status, step, trainSteps, lastError, lastMetrics, ..."""
        return json.loads(self.client._run(["run", "status", self.id, "--json"]))

    def wait(
        self, timeout: float | None = None, drive: bool = True, poll_s: float = 2.0
    ) -> dict[str, Any]:
        """Wait for the run to finish; returns its final status.

        drive=True runs `rlq up --run ID --exit-when-done` (the controller and every worker) until
        the run completes, is cancelled or pauses for a fault; drive=False only polls the status,
        for a run that other rlq processes drive, until it is completed, cancelled or paused.
        """
        if drive:
            argv = [*self.client.command, "up", "--run", self.id, "--exit-when-done"]
            r = subprocess.run(
                argv,
                env=self.client.env,
                cwd=self.client.cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            status = self.status()
            if r.returncode != 0 and status["status"] not in ("paused", *_TERMINAL):
                raise RlqCommandError(argv, r.returncode, r.stderr)
            return status
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status["status"] in _TERMINAL or status["status"] == "paused":
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {self.id} is still {status['status']} after {timeout} s"
                )
            time.sleep(poll_s)

    def up(self, **popen_kwargs: Any) -> subprocess.Popen:
        """Drive the run in the background: `rlq up --run ID --exit-when-done` (the controller and
        every worker), for a caller that steers it (pause, resume, amend) while it runs.

        Returns the process: wait() for its exit code (0 once the run completes or is cancelled; an
        operator's pause keeps it waiting for the resume), or terminate() it. popen_kwargs go to
        subprocess.Popen (e.g. stderr=a file).
        """
        argv = [*self.client.command, "up", "--run", self.id, "--exit-when-done"]
        return subprocess.Popen(
            argv, env=self.client.env, cwd=self.client.cwd, **popen_kwargs
        )

    def pause(self) -> None:
        self.client._run(["run", "pause", self.id])

    def resume(self) -> None:
        self.client._run(["run", "resume", self.id])

    def cancel(self) -> None:
        self.client._run(["run", "cancel", self.id])

    def amend(self, **changes: Any) -> None:
        """Ask the controller to change run-config keys (validated as `rlq run amend --set` is)."""
        if not changes:
            raise ValueError("amend: give at least one key=value")
        sets = [
            a for k, v in changes.items() for a in ("--set", f"{k}={json.dumps(v)}")
        ]
        self.client._run(["run", "amend", self.id, *sets])

    def rollouts(
        self,
        columns: Sequence[str] = (
            "group_id",
            "sample_index",
            "step",
            "prompt",
            "response",
            "reward",
            "status",
            "outcome",
            "outcome_reason",
        ),
        where: str | None = None,
        limit: int = 100_000,
    ) -> list[dict[str, Any]]:
        """Rows of rollout_history (docs/sql.md) for this run, in order; `where` is an extra SQL condition."""
        for c in columns:
            if not _IDENT.match(c):
                raise ValueError(
                    f"column {c!r}: expected a rollout_history column name such as reward or response"
                )
        run_id = self.id.replace("'", "''")
        query = (
            f"SELECT {', '.join(columns)} FROM rollout_history WHERE run_id = '{run_id}'"
            + (f" AND ({where})" if where else "")
            + " ORDER BY step, group_id, sample_index"
        )
        return self.client.sql(query, limit=limit)

    def rollouts_frame(self, **kwargs: Any):
        """rollouts() as a pandas DataFrame (pandas is optional: pip install pandas)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                "rollouts_frame needs pandas: pip install pandas (or pip install ./python/rlq_client[pandas])"
            ) from e
        return pd.DataFrame(self.rollouts(**kwargs))
