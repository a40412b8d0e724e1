"""`eagle3kit extract`: the target's hidden states for every sample of a token dataset.

Per token it stores the auxiliary states at the layer ids (boundary convention: id k is the
input of decoder layer k, the HF `output_hidden_states[k]`) and the last decoder layer's
output before the final norm, the state vLLM's id N names (EAGLE3.md §1.1, §2): HF's own
`hidden_states[N]` is after the norm, so the last state is taken with a forward hook.

Work is batched by a token budget, longest samples first (little padding, and a batch too
big for memory fails at once, not hours in); padding is never stored. Samples are assigned
to torchrun ranks by a hash of their id, and each commit is the format's crash-safe one, so
rerunning the same command, with any number of ranks, continues where a run stopped.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import xxhash

from eagle3kit import _text, _ui
from eagle3kit._ranks import Ranks
from eagle3kit.errors import UserError
from eagle3kit.extract.config import ExtractConfig
from eagle3kit.extract.hf import HfEngine
from eagle3kit.extract.result import ExtractResult
from eagle3kit.format import (
    Dataset,
    HiddenDataset,
    HiddenSample,
    HiddenWriter,
    committed_ids,
    hidden_bytes_per_token,
    is_dataset,
)
from eagle3kit.target import (
    TargetInfo,
    has_tokenizer,
    identity_mismatch,
    resolve_device,
    resolve_layer_ids,
    tokenizer_identity,
    tokenizer_mismatch,
)

DISK_MARGIN = 1.05
"""Free space asked for beyond the estimate: shard headers, ids, a commit in flight."""


# The token dataset ------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One sample to extract: where it is in the token dataset, and what to call it."""

    index: int
    length: int
    sample_id: str
    partition: str


def scan(tokens: Dataset) -> tuple[list[Item], int]:
    """Every sample (verifying each shard once) and the largest token id."""
    items: list[Item] = []
    top = -1
    base = 0
    for shard in tokens.columns():
        starts, names = shard.starts, shard.partition_names
        parts = shard.partition_index.tolist()
        items += [
            Item(base + i, starts[i + 1] - starts[i], sid, names[parts[i]])
            for i, sid in enumerate(shard.ids)
        ]
        if len(shard.tokens):
            top = max(top, int(shard.tokens.max()))
        base += len(starts) - 1
    return items, top


def owner(sample_id: str, world: int) -> int:
    """The rank that extracts a sample: a hash of its id, so any world size can resume."""
    return xxhash.xxh3_64_intdigest(sample_id.encode()) % world


def check_match(cfg: ExtractConfig, tokens: Dataset, top_id: int, target: TargetInfo) -> dict:
    """Refuse a token dataset made for another model, before any work; return the
    tokenizer identity to record."""
    where = f"{cfg.tokens} does not match --target {target.path}"
    if top_id >= target.vocab_size:
        raise UserError(
            f"{where}: it holds token id {top_id}, the target embeds only "
            f"{target.vocab_size} ids. Was it generated with another model?"
        )
    source = cfg.tokenizer or tokens.tokenizer_dir
    if not has_tokenizer(source):
        return {}
    ours = tokenizer_identity(source, cfg.trust_remote_code)
    if ours["size"] > target.vocab_size:
        raise UserError(
            f"{where}: its tokenizer ({source}) has {ours['size']} tokens, more "
            f"than the target's {target.vocab_size} embedding rows"
        )
    if has_tokenizer(target.path):
        theirs = tokenizer_identity(target.path, cfg.trust_remote_code)
        if tokenizer_mismatch(ours, theirs):
            raise UserError(
                f"{where}: its tokenizer ({source}, {ours['size']} tokens) differs "
                f"from the target's ({theirs['size']} tokens); the same ids would "
                "mean other text. Pass --tokenizer if the dataset's copy is wrong."
            )
    return ours


# Planning ---------------------------------------------------------------------------------
@dataclass
class Workload:
    todo: list[Item]
    """This rank's samples still to extract, longest first."""
    total: int
    done_before: int
    remaining_tokens: int
    """Tokens still to extract on all ranks: what the disk must hold."""
    skipped: dict[str, str]


def workload(
    items: list[Item], done: set[str], rank: int, world: int, max_positions: int | None
) -> Workload:
    skipped: dict[str, str] = {}
    todo: list[Item] = []
    remaining = 0
    for item in items:
        if item.sample_id in done:
            continue
        if item.length == 0:
            why = "no tokens"
        elif max_positions and item.length > max_positions:
            why = f"{item.length} tokens, longer than the target's context ({max_positions})"
        else:
            remaining += item.length
            if owner(item.sample_id, world) == rank:
                todo.append(item)
            continue
        if owner(item.sample_id, world) == rank:
            skipped[item.sample_id] = why
    todo.sort(key=lambda it: -it.length)
    return Workload(todo, len(items), len(done), remaining, skipped)


def batches(todo: list[Item], budget: int, most: int | None = None) -> Iterator[list[Item]]:
    """Consecutive items (longest first) while batch size x longest length fits `budget`
    (and there are at most `most`)."""
    batch: list[Item] = []
    for item in todo:
        if batch and ((len(batch) + 1) * batch[0].length > budget or len(batch) == most):
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch


def free_bytes(path: Path) -> int:
    """Free space where `path` is or will be created."""
    probe = path.absolute()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk(
    cfg: ExtractConfig, need: int, free: int, bytes_per_token: float, p: Workload
) -> None:
    _ui.info(
        f"extract: {p.total - p.done_before:,} of {p.total:,} samples to do "
        f"({p.remaining_tokens:,} tokens); about {_text.human_bytes(need)} at "
        f"{bytes_per_token:,.0f} bytes/token ({cfg.codec}); {_text.human_bytes(free)} free at "
        f"{cfg.out}",
        cfg.output,
    )
    if need > free and not (cfg.ignore_disk_check or cfg.dry_run):
        raise UserError(
            f"{cfg.out}: about {_text.human_bytes(need)} needed, only "
            f"{_text.human_bytes(free)} free. "
            "Free some space, pick --codec fp8 (about half the size), write "
            "elsewhere, or pass --ignore-disk-check to start anyway (a full disk "
            "stops the run; what was committed stays intact)."
        )


# Running ----------------------------------------------------------------------------------
def _layout(
    layers: list[int], target: TargetInfo, tokenizer: dict, tokens_record: dict, target_record: dict
) -> dict:
    """What the states mean: fixed for the dataset's life (paths go to provenance)."""
    return {
        "layer_ids": layers,
        "layer_convention": "boundary",
        "num_layers": target.num_layers,
        "hidden_size": target.hidden_size,
        "last_state": "pre_norm",
        "dtype": "bfloat16",
        "target": target_record,
        "tokenizer": tokenizer,
        "tokens": tokens_record,
    }


def _recorded_layout(cfg: ExtractConfig) -> dict:
    """The layout of the dataset this run continues ({} when it starts one)."""
    if cfg.write.mode == "overwrite" or not is_dataset(cfg.out):
        return {}
    try:
        return HiddenDataset(cfg.out).layout
    except UserError:
        return {}


def _tokens_record(cfg: ExtractConfig, tokens: Dataset) -> dict:
    """The input token dataset as the layout records it: its identity, and gen's record of
    how its completions were sampled and returned, which train's held-out prediction reads
    (format's Recorded.drawn_at). A dataset an older eagle3kit started lacks the last two;
    when the rest names this same token dataset that record stays, so the run continues
    (the writer refuses any change to the layout) and its sampling reads as unknown."""
    manifest, recorded = tokens.manifest, tokens.recorded()
    fresh = {
        "created": manifest.get("created"),
        "written_by": manifest.get("written_by"),
        "config_xxh3": xxhash.xxh3_128_hexdigest(
            orjson.dumps(manifest.get("config", {}), option=orjson.OPT_SORT_KEYS)
        ),
        "sampling": None if recorded.sampling is None else dict(recorded.sampling),
        "api_family": recorded.api_family,
    }
    older = _recorded_layout(cfg).get("tokens")
    if isinstance(older, dict) and set(older) < set(fresh):
        return older if all(older[k] == fresh[k] for k in older) else fresh
    return fresh


def _target_record(cfg: ExtractConfig, identity: dict) -> dict:
    """The target identity the dataset records. A dataset an older eagle3kit started carries
    fewer keys; when they name this same target that record stays, so the run continues
    (the writer refuses any change to the layout)."""
    recorded = _recorded_layout(cfg).get("target")
    if (
        isinstance(recorded, dict)
        and set(recorded) < set(identity)
        and identity_mismatch(recorded, identity) is None
    ):
        return recorded
    return identity


def _manifest_config(cfg: ExtractConfig) -> dict:
    """The config the manifest records: a continuing run must share it (or pass --force)."""
    return {
        "stage": "extract",
        "engine": cfg.engine,
        "codec": cfg.codec,
        "dtype": cfg.dtype,
        "model": cfg.model,
    }


def run(cfg: ExtractConfig) -> ExtractResult:
    with Ranks.joined() as ranks:
        cfg = ranks.voiced(cfg)
        result = _extract(cfg, ranks)
    _report(result, cfg)
    return result


def _extract(cfg: ExtractConfig, ranks: Ranks) -> ExtractResult:
    if cfg.engine == "hf" and not cfg.device_map:
        resolve_device(cfg.device, ranks.local_rank)  # a GPU not here: refused before reading
    tokens = Dataset(cfg.tokens)
    _ui.warn_all(tokens.warnings)
    target = TargetInfo.load(Path(str(cfg.target)), cfg.trust_remote_code)
    layers = resolve_layer_ids(cfg.layers, target.num_layers)  # type: ignore[arg-type]
    items, top_id = scan(tokens)
    tokenizer = check_match(cfg, tokens, top_id, target)
    work = workload(items, committed_ids(cfg.out), ranks.rank, ranks.world, target.max_positions)
    per_token = hidden_bytes_per_token(target.hidden_size, len(layers), cfg.codec)
    need, free = int(work.remaining_tokens * per_token * DISK_MARGIN), free_bytes(cfg.out)
    check_disk(cfg, need, free, per_token, work)
    result = ExtractResult(
        str(cfg.out),
        work.total,
        work.done_before,
        0,
        {},
        0,
        0.0,
        0.0,
        0.0,
        need,
        free,
        cfg.codec,
        layers,
        cfg.dry_run,
        ranks.rank,
        ranks.world,
    )
    if cfg.dry_run:
        return result
    engine = _engine(cfg, target, layers, ranks)
    writer = HiddenWriter(
        cfg.out,
        layout=_layout(
            layers,
            target,
            tokenizer,
            _tokens_record(cfg, tokens),
            _target_record(cfg, target.identity),
        ),
        codec=cfg.codec,
        config=_manifest_config(cfg),
        **cfg.write.writer_options(),
        provenance={
            "target": str(target.path.absolute()),
            "tokens": str(cfg.tokens.absolute()),
            "server": cfg.server,
            "trust_remote_code": cfg.trust_remote_code,
        },
        run_id=ranks.run_id,
        rank=ranks.rank,
    )
    _ui.warn_all(writer.warnings)
    started, cpu = time.monotonic(), time.process_time()
    with writer, _closing(engine):
        # Another run may have committed since the plan: the writer's ids are the truth.
        todo = [it for it in work.todo if it.sample_id not in writer.done_ids]
        # One process shows the whole dataset; a rank shows its own share.
        total = work.total if ranks.world == 1 else len(todo)
        with _ui.Progress("extract", total, cfg.output, initial=total - len(todo)) as progress:
            for sample_id, why in work.skipped.items():
                writer.note_skipped(sample_id, why)
            _loop(cfg, tokens, todo, engine, writer, progress, result)
    result.skipped.update(work.skipped)
    result.elapsed = round(time.monotonic() - started, 3)
    result.cpu_seconds = round(time.process_time() - cpu, 3)
    result.tokens_per_s = round(result.tokens / result.elapsed, 1) if result.elapsed else 0.0
    return result


def _loop(
    cfg: ExtractConfig,
    tokens: Dataset,
    todo: list[Item],
    engine: Any,
    writer: HiddenWriter,
    progress: _ui.Progress,
    result: ExtractResult,
) -> None:
    # A server batches for itself: it gets enough samples at a time to keep it busy.
    groups = (
        batches(todo, 1 << 62, 2 * cfg.concurrency)
        if cfg.engine == "vllm"
        else batches(todo, cfg.batch_tokens)
    )
    for batch in groups:
        views = [tokens.token_view(it.index) for it in batch]
        for item, view, states in zip(
            batch, views, engine.states([v.input_ids for v in views]), strict=True
        ):
            if states is None:
                why = "the target's states hold NaN or Inf"
                writer.note_skipped(item.sample_id, why)
                result.skipped[item.sample_id] = why
                progress.add(1, skipped=1)
                continue
            aux, last = states
            writer.add(
                HiddenSample(
                    item.sample_id,
                    view.input_ids,
                    view.loss_mask,
                    aux,
                    last,
                    item.partition,
                    view.prompt_len,
                )
            )
            result.written += 1
            result.tokens += item.length
            progress.add(1, tokens=item.length)
        writer.maybe_commit()


@contextmanager
def _closing(engine: Any) -> Iterator[None]:
    try:
        yield
    finally:
        if hasattr(engine, "close"):
            engine.close()


def _engine(cfg: ExtractConfig, target: TargetInfo, layers: list[int], ranks: Ranks) -> Any:
    if cfg.engine == "vllm":
        from eagle3kit.extract.vllm import VllmEngine

        return VllmEngine.connect(cfg, target, layers)
    return HfEngine.load(cfg, target, layers, ranks)


def _report(result: ExtractResult, cfg: ExtractConfig) -> None:
    opts = cfg.output
    if opts.json:
        _ui.print_json(asdict(result))
    if result.dry_run:
        return
    _ui.kv(
        "extract",
        [
            ("dataset", result.output),
            (
                "samples",
                f"{result.previously_done + result.written:,}/{result.total:,} "
                f"({result.written:,} this run)",
            ),
            ("skipped", f"{len(result.skipped):,}"),
            ("layers", ",".join(map(str, result.layer_ids)) + " (boundary ids; last: pre-norm)"),
            ("codec", result.codec),
            ("speed", f"{result.tokens_per_s:,.0f} tokens/s"),
            ("elapsed", f"{result.elapsed:.1f}s"),
        ],
        opts,
    )
    for sid, why in list(result.skipped.items())[:5]:
        _ui.warn(f"skipped sample {sid}: {why}")
