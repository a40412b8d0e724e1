"""What gen's fault, crash, hostile-server and transformers tests share: the prompt files, the
fake server's tokenizer, a gen run from Python or the command line, and the checks that a
stored sample is exactly what the server sent. Not a test module: the tests import it."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from fakeserver import FakeServer, HFTokenizer, load_tokenizer

from eagle3kit import gen
from eagle3kit._options import WRITE_KEYS, WriteOptions
from eagle3kit._ui import OutputOptions
from eagle3kit.format import Dataset, TokenSample
from eagle3kit.gen.config import ServerSpec

DATA = Path(__file__).parent / "data" / "prompts" / "eagle"
MT_BENCH = DATA / "mt_bench" / "question.jsonl"  # two turns per question
QA = DATA / "qa" / "question.jsonl"  # one short turn per question
GEN_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
_SERVED: dict[str, HFTokenizer] = {}


def served(tokenizer_dir: Path) -> HFTokenizer:
    """The fake server's copy of a tokenizer, loaded once: reading Qwen3's 7.7 MB
    tokenizer.json costs ~0.7 s, for every server a test starts. Rust tokenizers are safe to
    share between the servers' threads."""
    key = str(tokenizer_dir)
    if key not in _SERVED:
        _SERVED[key] = load_tokenizer(tokenizer_dir)
    return _SERVED[key]


def prompt_file(tmp_path: Path, n: int, source: Path = MT_BENCH, skip: int = 0) -> Path:
    lines = source.read_bytes().splitlines()[skip : skip + n]
    path = tmp_path / f"{source.parent.name}.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def servers(*specs: FakeServer | tuple[FakeServer, int]) -> list[ServerSpec]:
    out = []
    for spec in specs:
        srv, slots = spec if isinstance(spec, tuple) else (spec, None)
        out.append(ServerSpec(srv.url, slots))
    return out


def run_gen(
    prompts: Path, out: Path, srv: FakeServer | list[ServerSpec], tokenizer: Path, **kw
) -> gen.GenResult:
    kw.setdefault("max_tokens", 48)
    kw.setdefault("commit_every", 4)
    specs = srv if isinstance(srv, list) else servers(srv)
    write = WriteOptions(**{k: kw.pop(k) for k in WRITE_KEYS if k in kw})
    return gen.run(
        gen.GenConfig(
            [prompts],
            out,
            servers=specs,
            tokenizer=tokenizer,
            output=OutputOptions(quiet=True),
            write=write,
            **kw,
        )
    )


def ints(ids) -> list[int]:
    return [int(t) for t in ids]


def check_exact(
    out: Path, srv: FakeServer, stop_ids: list[int], min_completion_tokens: int = 0
) -> list[TokenSample]:
    """Every sample is stored once and holds exactly what the server's model produces."""
    ds = Dataset(out)
    samples = list(ds)
    ids = [s.sample_id for s in samples]
    assert len(ids) == len(set(ids)), "a sample is stored twice"
    for s in samples:
        if s.finish_reason.startswith("skipped"):
            assert len(s.completion_ids) == 0
            continue
        sampling = s.metadata["sampling"]
        want, finish = srv.expected(
            ints(s.prompt_ids),
            max_tokens=sampling["max_tokens"],
            stop_token_ids=stop_ids,
            seed=sampling["seed"],
        )
        assert ints(s.completion_ids) == want, s.sample_id
        if s.finish_reason == "filtered:min_completion_tokens":
            assert finish == "stop" and len(want) < min_completion_tokens
        else:
            assert s.finish_reason == finish, s.sample_id
    return samples


def gen_requests(srv: FakeServer) -> list[dict]:
    return [r for r in srv.requests if r["path"] in GEN_PATHS]


def sample_of(rec: dict) -> str:
    """The sample id a generation request was for: request ids are `{id}-a{n}-{random}`."""
    rid = rec["rid"] or rec["request_id"]
    return rid.rsplit("-", 2)[0]


def cli(capfd, monkeypatch, *args: str) -> tuple[int, str, str]:
    """The real command line, run in this process (a subprocess would spend ~5 s importing):
    (exit status, stdout, stderr), captured at the file-descriptor level."""
    from eagle3kit.cli import main

    monkeypatch.setattr(sys, "argv", ["eagle3kit", *args])
    capfd.readouterr()
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    out, err = capfd.readouterr()
    return code, out, err


def switch_faults_when(srv: FakeServer, outcome: str, n: int, **faults) -> threading.Thread:
    """Change srv's faults once `n` generation requests have had `outcome`."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(r["outcome"] == outcome for r in gen_requests(srv)) >= n:
                break
            time.sleep(0.01)
        srv.set_faults(**faults)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread
