"""Recording what a gen run produced: each answer, or why a turn has none, as one sample.

Every sample goes to the dataset writer, which commits on its cadence; the first error
storing one ends the run (through the supervisor) with everything committed before intact.
"""

from __future__ import annotations

from eagle3kit import _ui
from eagle3kit.errors import UserError
from eagle3kit.format import DatasetWriter, TokenSample
from eagle3kit.gen.config import GenConfig
from eagle3kit.gen.jobs import Chain, Job
from eagle3kit.gen.supervisor import Supervisor, UnusableAnswer
from eagle3kit.gen.types import Completion


class Recorder:
    """Turns answers and skips into samples and counts them."""

    def __init__(
        self,
        cfg: GenConfig,
        writer: DatasetWriter,
        progress: _ui.Progress,
        stats: dict[str, int],
        supervisor: Supervisor,
    ) -> None:
        self.cfg, self.writer, self.progress = cfg, writer, progress
        self.stats, self.supervisor = stats, supervisor

    def record(self, job: Job, c: Completion) -> str | None:
        """Store the answer to `job`; its finish reason, or None when --strict ended the run
        on it instead."""
        if c.violations:
            self.stats["violations"] += 1
            if self.cfg.strict:
                self.supervisor.fail(strict_error(c.server.get("url", "?"), job, c.violations))
                return None
        finish = c.finish_reason
        if finish == "stop" and len(c.output_ids) < self.cfg.min_completion_tokens:
            finish = "filtered:min_completion_tokens"
            # Filtered samples must be counted, not only stored (GenResult.filtered).
            self.stats["filtered"] += 1
        sample = self.sample(
            job.chain,
            job.turn,
            job.request.prompt_ids,
            c.output_ids,
            finish,
            metadata=self._metadata(job, c),
            server=c.server,
            latency=round(c.latency, 4),
            counts={
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                **c.counts,
            },
        )
        self.store(sample, c.server.get("url"))
        truncated = finish == "length"
        self.stats["truncated"] += truncated
        self.progress.add(
            1,
            rows=(f"partition:{job.chain.conv.partition}", f"server:{c.server.get('url', '?')}"),
            tokens=len(c.output_ids),
            truncated=int(truncated),
            violations=int(bool(c.violations)),
        )
        return finish

    def _metadata(self, job: Job, c: Completion) -> dict:
        cfg = self.cfg
        metadata: dict = {
            "sampling": {
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "top_k": cfg.top_k,
                "min_p": cfg.min_p,
                "seed": job.request.seed,
                "max_tokens": job.request.max_tokens,
            }
        }
        if c.violations:
            metadata["violations"] = c.violations
        if c.reconstructed:
            metadata["reconstructed"] = True
        if job.attempts:
            metadata["attempts"] = job.attempts + 1
        metadata["messages"] = job.messages
        if job.chain.conv.tools:
            metadata["tools"] = job.chain.conv.tools
        return metadata

    def sample(
        self,
        chain: Chain,
        turn: int,
        prompt_ids: list[int],
        completion_ids: list[int],
        finish: str,
        **extra,
    ) -> TokenSample:
        conv = chain.conv
        metadata = {**conv.extra, **extra.pop("metadata", {})}
        return TokenSample(
            sample_id=chain.ids[turn],
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            finish_reason=finish,
            partition=conv.partition,
            source={"file": conv.source, "line": conv.line, "turn": turn, "index": chain.index},
            metadata=metadata,
            **extra,
        )

    def store(self, sample: TokenSample, server: str | None = None) -> None:
        """Add a sample to the dataset; a failure becomes the error that ends the run."""
        try:
            self.writer.add(sample)
        except (ValueError, TypeError, OverflowError) as exc:
            raise UnusableAnswer(
                f"{server or 'gen'}: the answer for sample {sample.sample_id} cannot be stored "
                f"({exc}); everything committed before is intact"
            ) from None

    def skip(
        self,
        chain: Chain,
        turn: int,
        prompt_ids: list[int],
        finish: str,
        why: str,
        metadata: dict | None = None,
    ) -> None:
        """Record `turn` as skipped (`finish`, e.g. skipped:failed), and the turns after it."""
        self.store(
            self.sample(
                chain, turn, prompt_ids, [], finish, metadata={"reason": why, **(metadata or {})}
            )
        )
        self.progress.add(1, rows=(f"partition:{chain.conv.partition}",), skipped=1)
        self.skip_rest(chain, turn + 1, f"turn {turn}: {finish}")

    def skip_rest(self, chain: Chain, first: int, why: str) -> None:
        """Later turns would build on a turn that did not finish: record them as skipped."""
        for later in range(first, len(chain.ids)):
            self.store(
                self.sample(chain, later, [], [], "skipped:earlier_turn", metadata={"reason": why})
            )
            self.progress.add(1, rows=(f"partition:{chain.conv.partition}",), skipped=1)


def strict_error(url: str, job: Job, violations: list[str]) -> UserError:
    return UserError(
        f"{url}: response for sample {job.request.sample_id} breaks the server invariants "
        f"({'; '.join(violations)}); stopping because of --strict"
    )
