"""Start, watch and query rlq runs from Python (standard library only).

Every call runs the `rlq` command (src/cli/main.ts) and reads its output:
`rlq run start --config FILE` prints the run id, `rlq run status ID --json`
the status report (src/api.ts RunStatusReport), `rlq sql --json` rows as a
JSON array through the reader role (docs/sql.md).
"""

from .client import Rlq, RlqCommandError, Run

__all__ = ["Rlq", "RlqCommandError", "Run"]
