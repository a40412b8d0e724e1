"""docs/plan.md runs: every command it shows, against a stand-in with a server's timing.

The page's report comes from a server that takes time to decode: tests/fakeserver_timing.py
on the documented SGLang port (30000), with a fixed number of slots, a finite decode speed and
long answers to the code prompts (the HumanEval partition). Commands run as tests/test_docs.py
runs them (its helpers: a checkout-like work directory, `eagle3kit` and `python` shims), each
in a fresh process.

`python tests/test_docs_plan.py` rewrites the page's `console` outputs with what the
commands print against this stand-in (tests/test_docs.py's own refresh would use its
zero-latency stand-ins, and the report would show no time to forecast).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from doc_runner import LOOPBACK, checkout_like, commands, doc_env, free_port, refresh, shims
from fakeserver_timing import Lengths, TimedServerProcess

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "plan.md"
DOCUMENTED_PORT = 30000
STAND_IN = {
    "slots": 16,
    "decode_tps": 250.0,
    "context_length": 32768,
    "record_bodies": False,
    "lengths": {"Complete the code": Lengths(800, 0.4, tail=0.2, tail_factor=3)},
    "default_lengths": Lengths(60, 0.5),
}
"""The SGLang stand-in on the documented port: 16 slots, 250 tok/s per request, answers of
~70 tokens, ~860 for code prompts, a fifth of which run three times longer."""


class PlanServer:
    """The stand-in; maps the documented port to the one it listens on, and back."""

    def __init__(self, tokenizer_dir: Path) -> None:
        self.server = TimedServerProcess(
            "sglang", port=free_port(5), tokenizer=str(tokenizer_dir / "tokenizer.json"), **STAND_IN
        ).start()

    def substitute(self, text: str) -> str:
        return LOOPBACK.sub(lambda m: self._port(m, DOCUMENTED_PORT, self.server.port), text)

    def restore(self, text: str) -> str:
        return LOOPBACK.sub(lambda m: self._port(m, self.server.port, DOCUMENTED_PORT), text)

    @staticmethod
    def _port(m, old: int, new: int) -> str:
        return f"127.0.0.1:{new if int(m.group(1)) == old else m.group(1)}"

    def stop(self) -> None:
        self.server.terminate()


@pytest.fixture(scope="module")
def plan_server(tmp_path_factory):
    from real_tokenizers import qwen3_tokenizer_dir

    server = PlanServer(qwen3_tokenizer_dir(tmp_path_factory.getbasetemp()))
    yield server
    server.stop()


@pytest.mark.slow  # rebuilding the Qwen3 tokenizer as the page does, and five commands: ~2 min
def test_plan_page_commands_run(tmp_path, plan_server):
    cmds = commands(PAGE)
    assert any(c.text.startswith("eagle3kit plan ") for c in cmds)
    work = checkout_like(tmp_path)
    shims(tmp_path / "bin")
    env = doc_env(tmp_path / "bin")
    for cmd in cmds:
        text = plan_server.substitute(cmd.text)
        proc = subprocess.run(
            ["bash", "-c", text], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == cmd.status, (
            f"plan.md:{cmd.line}: `{text}` exited {proc.returncode}, the page says "
            f"{cmd.status}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )
        assert "Traceback" not in proc.stderr, text


def test_the_page_shows_a_plan_report():
    text = PAGE.read_text()
    for shown in (
        "forecast (range: 95% of outcomes)",
        "pilot, by partition",
        "wall time, the gen that follows",
        "hidden states, fp8",
        "note: the ",
    ):
        assert shown in text, shown


def main() -> None:
    from real_tokenizers import qwen3_tokenizer_dir

    root = Path(tempfile.mkdtemp(prefix="e3k-plan-doc-"))
    server = PlanServer(qwen3_tokenizer_dir(root))
    try:
        PAGE.write_text(refresh(PAGE, server, root / "run"))
        print(f"refreshed {PAGE}", file=sys.stderr)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
