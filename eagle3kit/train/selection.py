"""Which step a run's drafter/ holds: the evaluated step with the highest held-out predicted
acceptance length (`--drafter-step best`, the default), or the last step (`last`).

Acceptance can peak mid-training while the loss keeps falling, so the last step is not
always the one to serve. Pure functions over evaluation records (`EvalResult.to_dict()`,
with its `step`): no torch, no files; the Trainer keeps the best record, writes drafter/ when
it changes, and stores what `record` says in run.json for `info` to show.
"""

from __future__ import annotations

AL = "predicted_acceptance_length"
COMPARABLE = ("data", "eval_split", "eval_k")
"""The settings that decide what a held-out figure measures: a run continued with --force
and any of these changed chooses its best afresh (the earlier figures measured another
split or chain length)."""


def conditions_of(evaluation: dict) -> dict:
    """How a stored evaluation predicted, under the keys HeldOut.conditions gives: its
    `temperature`, `verify` rule and `prediction` method. An older eagle3kit's records name
    no method: "greedy" at temperature 0, else "expected"."""
    temperature = float(evaluation.get("temperature") or 0.0)
    method = evaluation.get("prediction") or ("expected" if temperature else "greedy")
    return {"temperature": temperature, "verify": evaluation.get("verify"), "prediction": method}


def measured_alike(evaluation: dict, conditions: dict) -> bool:
    """Whether a stored evaluation predicted under `conditions`: figures of another
    temperature or method are not comparable (the expected prediction on sampled data runs
    well above the data-path one)."""
    return conditions_of(evaluation) == conditions


def improves(evaluation: dict | None, best: dict | None) -> bool:
    """Whether `evaluation` beats the best so far: a trained step (>= 1; the untrained
    drafter of step 0 is the baseline, never the choice) with a strictly higher predicted
    acceptance length. A tie keeps the earlier step: the same prediction from fewer steps."""
    if evaluation is None or int(evaluation.get("step") or 0) < 1:
        return False
    return best is None or float(evaluation[AL]) > float(best[AL])


def patience_spent(patience: int, eval_every: int, best: dict | None, last: dict | None) -> bool:
    """Whether --patience evaluations in a row have passed since the best one: the last
    evaluation is at least `patience` evaluation periods after the best step. Read from the
    two records alone, so a resumed run decides as the whole run would have."""
    if patience < 1 or eval_every < 1 or best is None or last is None:
        return False
    return (int(last["step"]) - int(best["step"])) // eval_every >= patience


def better_of(first: dict | None, second: dict | None) -> dict | None:
    """The better of two best records (either may be None); on a tie the earlier step."""
    if first is None or second is None:
        return first or second
    if float(first[AL]) != float(second[AL]):
        return first if float(first[AL]) > float(second[AL]) else second
    return first if int(first["step"]) <= int(second["step"]) else second


def _figure(evaluation: dict) -> dict:
    return {
        "step": int(evaluation["step"]),
        AL: round(float(evaluation[AL]), 6),
        "k": evaluation.get("k"),
    }


def record(
    rule: str, held_step: int, best: dict | None, last_eval: dict | None, heldout: bool
) -> dict:
    """run.json's `selection`: the rule, the step drafter/ holds, why, and the figures it
    was chosen by (the best evaluation and the last one)."""
    last = last_eval if last_eval is not None and int(last_eval.get("step") or 0) >= 1 else None
    out: dict = {
        "rule": rule,
        "step": held_step,
        "best": None if best is None else _figure(best),
        "last": None if last is None else _figure(last),
    }
    out["why"] = _why(rule, held_step, best, last, heldout)
    return out


def _why(rule: str, held_step: int, best: dict | None, last: dict | None, heldout: bool) -> str:
    if not heldout:
        return "no held-out split (--eval-split 0): nothing to choose by, so the last step"
    if best is None:
        return (
            "no evaluation after training began yet (--eval-every, and the run's last "
            "step): the last step"
        )
    best_text = f"held-out predicted AL {best[AL]:.3f} at step {best['step']}"
    last_text = "" if last is None else f"{last[AL]:.3f} at step {last['step']}"
    if rule == "last":
        if last is None or int(last["step"]) == int(best["step"]):
            return f"--drafter-step last; the best evaluated step is this one ({best_text})"
        return (
            f"--drafter-step last (the last evaluation: {last_text}); the best "
            f"evaluated step was {best['step']} ({best[AL]:.3f}), not kept in drafter/"
        )
    if last is None or int(last["step"]) == int(best["step"]):
        return f"the highest {best_text}, the last evaluated step"
    return f"the highest {best_text}; the last evaluation has {last_text}"
