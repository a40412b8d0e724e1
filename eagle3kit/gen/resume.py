"""Continuing a dataset: where each chain starts again, what an earlier run left failed,
and the closing check that every sample the prompts call for is stored."""

from __future__ import annotations

from eagle3kit import _ui
from eagle3kit._signals import continue_command
from eagle3kit.chat.render import Renderer
from eagle3kit.errors import CheckFailed
from eagle3kit.format import Dataset, DatasetWriter
from eagle3kit.gen.config import GenConfig
from eagle3kit.gen.jobs import Chain, resume_point


def starting_points(
    chains: list[Chain], writer: DatasetWriter, cfg: GenConfig, renderer: Renderer
) -> list[tuple[Chain, int]]:
    """Where each chain continues (its first turn not in the dataset); earlier own answers
    come back from the dataset.

    A later turn stored while an earlier one is not (a run that lost a commit stored it) was
    built on an answer the dataset no longer holds: it is taken out and generated again
    after the turn before it, never taken as the end of its chain."""
    starts = _unfinished(chains, writer)
    needed = {c.ids[t] for c, turn in starts for t in range(turn)}
    if needed:
        _restore_answers(starts, _committed_completions(cfg, needed), cfg, renderer)
    return starts


def _unfinished(chains: list[Chain], writer: DatasetWriter) -> list[tuple[Chain, int]]:
    """(chain, first turn not stored) of each chain not done; later turns stored without
    an earlier one are dropped from the dataset."""
    done = writer.done_ids
    starts: list[tuple[Chain, int]] = []
    stale: set[str] = set()
    for chain in chains:
        turn = resume_point(chain, done)
        if turn == len(chain.ids):
            continue
        starts.append((chain, turn))
        later = [sample_id for sample_id in chain.ids[turn + 1 :] if sample_id in done]
        stale.update(later)
    if stale:
        writer.drop(stale)
        _ui.warn(
            f"{len(stale):,} later turn(s) were stored without the turn before them "
            "(an earlier run lost that commit): they are generated again after it"
        )
    return starts


def _restore_answers(
    starts: list[tuple[Chain, int]],
    committed: dict[str, tuple[str, list]],
    cfg: GenConfig,
    renderer: Renderer,
) -> None:
    """Each chain's turns done before, back from the dataset: a turn that did not finish
    blocks the chain; under --history own its answers are the next turns' history."""
    for chain, turn in starts:
        chain.turn = turn
        for t in range(turn):
            finish, ids = committed[chain.ids[t]]
            if finish != "stop":
                chain.blocked = f"turn {t}: {finish}"
            elif cfg.history == "own":
                chain.answers.append(renderer.answer_message(ids))


def _committed_completions(cfg: GenConfig, needed: set[str]) -> dict[str, tuple[str, list]]:
    ds = Dataset(cfg.out, warn_stray=False)
    found = {}
    for index, sample_id in enumerate(ds.sample_ids()):
        if sample_id in needed:
            sample = ds[index]
            found[sample_id] = (sample.finish_reason, list(map(int, sample.completion_ids)))
    return found


def retry_failed(chains: list[Chain], writer: DatasetWriter, cfg: GenConfig) -> int:
    """Take the samples an earlier run recorded as skipped:failed out of the dataset, with the
    later turns skipped because of them, so that this run generates them again; returns how
    many failed samples that is. Only shards whose manifest counts show a failure are read."""
    failed = Dataset(cfg.out, warn_stray=False).ids_with_finish("skipped:failed")
    if not failed:
        return 0
    again: set[str] = set()
    retried = 0
    for chain in chains:
        for turn, sample_id in enumerate(chain.ids):
            if sample_id in failed:
                again.update(chain.ids[turn:])
                retried += 1
                break
    if retried:
        writer.drop(again)
        _ui.info(
            f"retrying {retried:,} sample(s) an earlier run recorded as failed "
            "(--keep-failed leaves them)",
            cfg.output,
        )
    return retried


def check_complete(cfg: GenConfig, chains: list[Chain], total: int) -> None:
    """A run that ended by itself must leave every sample in the dataset (a sample that
    could not be generated is stored too, with its skipped: reason). Read back from the
    committed shards, so a loss anywhere on the way is found now, not by a later stage."""
    held = set(Dataset(cfg.out, warn_stray=False).sample_ids())
    missing = sum(sample_id not in held for chain in chains for sample_id in chain.ids)
    if missing:
        raise CheckFailed(
            f"{cfg.out}: the run ended with {missing:,} of the {total:,} samples the prompts "
            "call for not in the dataset (please report it); what is stored is intact. "
            f"Rerun to generate them: {continue_command()}"
        )
