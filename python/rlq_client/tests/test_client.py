"""The client against a real rlq: started by test/integration/python-client.test.ts, which gives a
database, queue and fake engine/trainer in RLQ_CLIENT_TEST_* (the rlq command, its env, a config).
"""

import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlq_client import Rlq, RlqCommandError  # noqa: E402


def _given(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(
            f"{name} is not set: run this test through vitest (npx vitest run --project integration test/integration/python-client.test.ts)"
        )
    return value


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.rlq = Rlq(
            command=json.loads(_given("RLQ_CLIENT_TEST_COMMAND")),
            env=json.loads(_given("RLQ_CLIENT_TEST_ENV")),
        )
        self.config = json.loads(_given("RLQ_CLIENT_TEST_CONFIG"))

    def test_start_amend_wait_status_and_rollouts_in_sql(self):
        run = self.rlq.start(self.config, name="from-python")
        self.assertRegex(run.id, r"^r[a-z0-9]+$")
        status = run.status()
        self.assertEqual(status["name"], "from-python")
        self.assertEqual(status["trainSteps"], 0)

        # An amend the controller applies when it starts: one step more than the config says.
        run.amend(num_rollout=self.config["num_rollout"] + 1)
        final = run.wait(timeout=300)
        self.assertEqual(final["status"], "completed", final["lastError"])
        self.assertEqual(final["trainSteps"], self.config["num_rollout"] + 1)
        self.assertEqual(final["numRollout"], self.config["num_rollout"] + 1)

        rows = run.rollouts(
            columns=["step", "reward", "outcome", "trained_step"], where="kept"
        )
        self.assertGreater(len(rows), 0)
        self.assertTrue(
            all(r["outcome"] == "kept" and r["trained_step"] is not None for r in rows)
        )
        # The same count through a statement of our own: the client's query adds nothing and loses nothing.
        n = self.rlq.sql(
            f"SELECT count(*)::int AS n FROM rollout_history WHERE run_id = '{run.id}' AND kept"
        )
        self.assertEqual(n, [{"n": len(rows)}])
        # Into pandas: the same rows, the columns in the order asked for.
        frame = run.rollouts_frame(
            columns=["step", "reward", "outcome", "trained_step"], where="kept"
        )
        self.assertEqual(
            list(frame.columns), ["step", "reward", "outcome", "trained_step"]
        )
        self.assertEqual(len(frame), len(rows))
        self.assertEqual(frame["reward"].tolist(), [r["reward"] for r in rows])

    def test_pause_observe_resume_completes(self):
        config = json.loads(_given("RLQ_CLIENT_TEST_PAUSE_CONFIG"))
        run = self.rlq.start(config, name="paused-from-python")
        # Recorded before anything drives the run: its controller applies it first.
        run.pause()
        with tempfile.TemporaryFile() as log:
            driver = run.up(stdout=log, stderr=log)
            try:
                paused = run.wait(drive=False, timeout=300, poll_s=0.2)
                self.assertEqual(paused["status"], "paused", paused["lastError"])
                self.assertEqual(paused["lastError"], "paused by operator")
                self.assertEqual(paused["trainSteps"], 0)
                # Still paused on a second look: the operator's pause holds until the resume.
                self.assertEqual(run.status()["status"], "paused")
                run.resume()
                code = driver.wait(timeout=300)
            finally:
                if driver.poll() is None:
                    driver.kill()
                    driver.wait()
            log.seek(0)
            output = log.read().decode(errors="replace")[-3000:]
        self.assertEqual(code, 0, output)
        final = run.status()
        self.assertEqual(final["status"], "completed", final["lastError"])
        self.assertEqual(final["trainSteps"], config["num_rollout"])

    def test_errors_name_the_command_and_its_message(self):
        with self.assertRaises(RlqCommandError) as e:
            self.rlq.run("rnosuchrun").status()
        self.assertIn("run rnosuchrun does not exist", e.exception.stderr)
        with self.assertRaises(RlqCommandError) as e:
            self.rlq.sql("DELETE FROM runs")
        self.assertNotEqual(e.exception.code, 0)
        with self.assertRaises(ValueError):
            self.rlq.run("r1").rollouts(columns=["reward; DROP TABLE runs"])


if __name__ == "__main__":
    unittest.main()
