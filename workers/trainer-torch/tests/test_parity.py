"""Parity: the Python loss math matches rlq/algorithms (TypeScript) to 1e-6 in float64.

The vectors are exported by `npx tsx scripts/export-parity-vectors.ts` into
workers/trainer-torch/parity-vectors.json (committed). Every number must be within
tolerance * max(1, |expected|); nulls, keys and shapes must match exactly.

    python3 -m unittest discover -s workers/trainer-torch/tests
"""

import json
import math
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from helpers import require  # noqa: E402

require("numpy")

from rlq_torch.parity import evaluate_parity_case  # noqa: E402

VECTORS = os.path.join(ROOT, "parity-vectors.json")


def compare(expected, actual, tol, path="$"):
    """Yields a message per mismatch."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            yield f"{path}: expected an object, got {type(actual).__name__}"
            return
        if set(expected) != set(actual):
            yield f"{path}: keys differ: missing {sorted(set(expected) - set(actual))}, extra {sorted(set(actual) - set(expected))}"
        for k in expected:
            if k in actual:
                yield from compare(expected[k], actual[k], tol, f"{path}.{k}")
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            yield f"{path}: expected a list of {len(expected)}, got {actual if not isinstance(actual, list) else len(actual)}"
            return
        for i, (e, a) in enumerate(zip(expected, actual)):
            yield from compare(e, a, tol, f"{path}[{i}]")
    elif expected is None:
        if actual is not None and not (
            isinstance(actual, float) and not math.isfinite(actual)
        ):
            yield f"{path}: expected null, got {actual}"
    elif isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if not isinstance(actual, (int, float)) or isinstance(actual, bool):
            yield f"{path}: expected {expected}, got {actual!r}"
        elif not abs(float(actual) - expected) <= tol * max(1.0, abs(expected)):
            yield f"{path}: expected {expected}, got {actual} (diff {abs(float(actual) - expected):.3e})"
    elif expected != actual:
        yield f"{path}: expected {expected!r}, got {actual!r}"


class ParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(VECTORS) as f:
            cls.doc = json.load(f)

    def test_file_covers_every_function(self):
        fns = {c["fn"] for s in self.doc["sets"] for c in s["cases"]}
        self.assertEqual(
            fns,
            {
                "postProcessRewards",
                "computeAdvantagesAndReturns",
                "computeApproxKl",
                "klLossWithGrad",
                "computePolicyLossTerms",
                "computeMisWeights",
                "aggregate",
                "logProbsAndEntropyFromLogits",
                "passAtK",
                "computeValueLossTerms",
            },
        )
        self.assertGreaterEqual(len(self.doc["sets"]), 2)
        self.assertEqual(self.doc["tolerance"], 1e-6)

    def test_every_case_matches(self):
        checked = 0
        for s in self.doc["sets"]:
            tol = s["tolerance"]
            for case in s["cases"]:
                with self.subTest(seed=s["seed"], case=case["name"]):
                    actual = evaluate_parity_case(
                        case["fn"], case["input"], case["options"]
                    )
                    problems = list(compare(case["output"], actual, tol))
                    self.assertEqual(
                        problems[:8], [], f"seed {s['seed']} case {case['name']!r}"
                    )
                    checked += 1
        self.assertGreater(checked, 100)

    def test_comparison_is_not_vacuous(self):
        case = next(
            c
            for c in self.doc["sets"][0]["cases"]
            if c["fn"] == "computePolicyLossTerms"
        )
        actual = evaluate_parity_case(case["fn"], case["input"], case["options"])
        actual["loss"] += 1e-5 * max(1.0, abs(actual["loss"]))
        self.assertTrue(list(compare(case["output"], actual, 1e-6)))


if __name__ == "__main__":
    unittest.main()
