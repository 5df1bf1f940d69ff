"""Evaluates a parity case (src/algorithms/parity-vectors.ts) with the Python port.

``evaluate_parity_case(fn, input, options)`` mirrors the TypeScript ``evaluateParityCase``:
same inputs, same defaults, output in the same plain-JSON shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import algorithms as A


def _r(x) -> A.Ragged:
    return A.Ragged.from_lists(x or [])


def _flat(x) -> list:
    return [float(v) for v in np.asarray(x, dtype=np.float64).tolist()]


def evaluate_parity_case(
    fn: str, inp: dict[str, Any], options: dict[str, Any]
) -> dict[str, Any]:
    if fn == "postProcessRewards":
        o = A.parse_options(options)
        _, normalized = A.post_process_rewards(inp["rewards"], inp["groupIndices"], o)
        return {"normalized": _flat(normalized)}
    if fn == "computeAdvantagesAndReturns":
        o = A.parse_options(options)
        mask = _r(inp["lossMask"])
        opt = lambda k: None if inp.get(k) is None else _r(inp[k])  # noqa: E731
        adv, ret, kl = A.compute_advantages_and_returns(
            inp["rewards"],
            mask,
            o,
            old_log_probs=opt("oldLogProbs"),
            ref_log_probs=opt("refLogProbs"),
            values=opt("values"),
        )
        return {
            "advantages": mask.tolist(adv),
            "returns": mask.tolist(ret),
            "kl": mask.tolist(kl),
        }
    if fn == "computeApproxKl":
        ratio = (
            None
            if inp.get("importanceRatio") is None
            else np.asarray(inp["importanceRatio"], dtype=np.float64)
        )
        return {
            "kl": _flat(
                A.compute_approx_kl(
                    np.asarray(inp["logProbs"], dtype=np.float64),
                    np.asarray(inp["baseLogProbs"], dtype=np.float64),
                    options["kl_loss_type"],
                    ratio,
                )
            )
        }
    if fn == "klLossWithGrad":
        old = (
            None
            if inp.get("oldLogProbs") is None
            else np.asarray(inp["oldLogProbs"], dtype=np.float64)
        )
        value, grad = A.kl_loss_with_grad(
            np.asarray(inp["logProbs"], dtype=np.float64),
            np.asarray(inp["refLogProbs"], dtype=np.float64),
            options["kl_loss_type"],
            old,
        )
        return {"value": _flat(value), "grad": _flat(grad)}
    if fn == "computePolicyLossTerms":
        o = A.parse_options(options)
        lp = _r(inp["logProbs"])
        f = lambda k: _r(inp.get(k)).flat  # noqa: E731
        t = A.policy_loss_terms(
            lp,
            f("advantages"),
            f("lossMask"),
            o,
            old=f("oldLogProbs"),
            ref=f("refLogProbs"),
            rollout=f("rolloutLogProbs"),
            entropy=f("entropy"),
            rollout_ids=inp.get("rolloutIds") or [],
        )
        return {
            "loss": t.loss,
            "pgLoss": lp.tolist(t.pg_loss),
            "tokenLoss": lp.tolist(t.token_loss),
            "dLoss_dLogp": lp.tolist(t.dloss_dlogp),
            "dLoss_dEntropy": lp.tolist(t.dloss_dentropy),
            "effectiveLossMask": lp.tolist(t.effective_loss_mask),
            "tisWeights": None if t.tis_weights is None else lp.tolist(t.tis_weights),
            "klLoss": None if t.kl_loss is None else lp.tolist(t.kl_loss),
            "metrics": t.metrics,
        }
    if fn == "computeMisWeights":
        o = A.parse_options(options)
        train = _r(inp["trainLogProbs"])
        w, mod, metrics = A.compute_mis_weights(
            train,
            train.flat,
            _r(inp["rolloutLogProbs"]).flat,
            _r(inp["lossMask"]).flat,
            o,
        )
        return {
            "weights": None if w is None else train.tolist(w),
            "modifiedMask": train.tolist(mod),
            "metrics": {k: train.tolist(v) for k, v in metrics.items()},
        }
    if fn == "aggregate":
        values = _r(inp["values"])
        mask = _r(inp["lossMask"])
        return {
            "value": A.aggregate(
                values,
                mask,
                calculate_per_token_loss=options.get("calculate_per_token_loss")
                is True,
                denom_mask=_r(inp.get("denomMask")),
                rollout_ids=inp.get("rolloutIds") or [],
            )
        }
    if fn == "logProbsAndEntropyFromLogits":
        logits = np.asarray(inp["logits"], dtype=np.float64)
        vocab = int(inp["vocabSize"])
        temp = float(options["rollout_temperature"])
        logp, ent = A.log_probs_and_entropy_from_logits(
            logits, inp["tokens"], vocab, temp
        )
        grad = A.logits_gradient(
            logits,
            inp["tokens"],
            vocab,
            temp,
            inp["dLoss_dLogp"],
            inp["dLoss_dEntropy"],
        )
        return {
            "logProbs": _flat(logp),
            "entropy": _flat(ent),
            "dLoss_dLogits": _flat(grad),
        }
    if fn == "passAtK":
        return {"value": A.pass_at_k(int(inp["n"]), int(inp["c"]), int(inp["k"]))}
    if fn == "computeValueLossTerms":
        values = _r(inp["values"])
        loss, grad, metrics = A.value_loss_terms(
            values,
            _r(inp["oldValues"]).flat,
            _r(inp["returns"]).flat,
            _r(inp["lossMask"]).flat,
            float(options["value_clip"]),
            options.get("calculate_per_token_loss") is True,
        )
        return {"loss": loss, "dLoss_dValue": values.tolist(grad), "metrics": metrics}
    raise ValueError(f"unknown parity function {fn}")
