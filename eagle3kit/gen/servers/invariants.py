"""The invariants every answer is checked against (reference/SERVER_APIS.md §4), whatever
the API: counts that agree, ids in range, the finish reason the ids show."""

from __future__ import annotations

from typing import Any

from eagle3kit.gen.servers.api import Reply, ServerInfo
from eagle3kit.gen.servers.errors import BadAnswer
from eagle3kit.gen.types import GenRequest


def check_invariants(
    reply: Reply, req: GenRequest, info: ServerInfo, rid: str | None = None
) -> tuple[list[int], list[str], int]:
    """SERVER_APIS.md §4 on one answer: (output ids, violations, prompt ids repaired away).

    SGLang's prompt-prefix bug is repaired: output ids longer than completion_tokens whose
    excess prefix equals the tail of the prompt lose that prefix; any other excess is a
    violation."""
    v: list[str] = []
    ids = reply.output_ids
    if reply.results != 1:
        v.append(f"{reply.results} results for one request")
    if rid is not None and reply.rid != rid:
        v.append(f"answer id {reply.rid!r} is not the rid sent {rid!r}")
    if set(map(type, ids)) - {int}:  # C-level passes: this runs on every answer
        return ids, [*v, "output ids are not all integers"], 0
    repaired = 0
    ct = reply.completion_tokens
    if ct is None:
        v.append("no completion_tokens reported")
    elif info.api == "sglang" and len(ids) > ct:
        excess = len(ids) - ct
        if ids[:excess] == req.prompt_ids[-excess:]:
            ids, repaired = ids[excess:], excess
        else:
            v.append(
                f"{len(ids)} output ids but completion_tokens = {ct}, "
                "and the excess is not the prompt's tail"
            )
    elif len(ids) != ct:
        v.append(f"{len(ids)} output ids but completion_tokens = {ct}")
    if info.api == "vllm" and reply.prompt_ids is None:
        v.append("no prompt_token_ids echoed")
    elif reply.prompt_ids is not None and reply.prompt_ids != req.prompt_ids:
        v.append("echoed prompt_token_ids differ from the ids sent")
    if (
        reply.prompt_tokens is not None
        and req.prompt_ids
        and reply.prompt_tokens != len(req.prompt_ids)
    ):
        v.append(
            f"prompt_tokens = {reply.prompt_tokens} but {len(req.prompt_ids)} prompt ids were sent"
        )
    if (problem := id_violation(ids, info.vocab_size)) is not None:
        v.append(problem)
    v.extend(_finish_violations(reply, req, info, ids))
    if (
        info.speculative is not None
        and reply.has_spec is not None
        and info.speculative != reply.has_spec
    ):
        v.append(
            "spec_* counters present"
            if reply.has_spec
            else "no spec_* counters from a speculative server"
        )
    return ids, v, repaired


INT32_END = 1 << 31


def id_violation(ids: list[Any], vocab_size: int | None) -> str | None:
    """Why these output ids cannot be stored as data, or None: every one must be an int in
    [0, vocab_size) (in int32 when the vocabulary is unknown)."""
    if set(map(type, ids)) - {int}:
        odd = next(t for t in ids if type(t) is not int)
        return f"output ids are not all integers (e.g. {odd!r})"
    top = INT32_END if vocab_size is None else min(vocab_size, INT32_END)
    if ids and (min(ids) < 0 or max(ids) >= top):
        bad = [t for t in ids if t < 0 or t >= top]
        return f"{len(bad)} output ids outside [0, {top}), e.g. {bad[0]}"
    return None


def refuse_bad_ids(ids: list[Any], info: ServerInfo, path: str) -> None:
    problem = id_violation(ids, info.vocab_size)
    if problem is not None:
        raise BadAnswer(f"POST {info.url}{path}: {problem}", url=info.url, violations=[problem])


def _finish_violations(
    reply: Reply, req: GenRequest, info: ServerInfo, ids: list[int]
) -> list[str]:
    finish, matched = reply.finish_reason, reply.matched
    last = ids[-1] if ids else None
    if finish is None:
        return ["no finish_reason"]
    if finish == "stop":
        if isinstance(matched, str):
            return [f"stopped on the string {matched!r}, but only stop token ids were sent"]
        if type(matched) is int and last != matched:
            return [f"finish stop on {matched} but the last output id is {last}"]
        if req.stop_token_ids and last not in req.stop_token_ids:
            return [f"finish stop on {last}, which is not among the stop_token_ids sent"]
    if finish == "length":
        at_context = (
            info.max_model_len is not None and len(req.prompt_ids) + len(ids) == info.max_model_len
        )
        if len(ids) != req.max_tokens and not at_context:
            return [
                f"finish length after {len(ids)} ids: "
                f"neither max_tokens ({req.max_tokens}) nor the context length"
            ]
    return []
