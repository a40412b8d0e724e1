"""docs/validate.md's gpt-oss report is real: the dataset it describes is built here (the
gpt-oss stand-in tokenizer with the real gpt-oss chat template, a few seeded defects), the
command the page shows is run, and its profile and checklist must be the page's lines.

tests/test_docs.py runs the page's `console` blocks; this report is a `text` block because its
dataset is built by this module, not by a command. To refresh the page after changing validate:
`python tests/test_docs_validate.py` prints the report to paste.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import pytest
from real_tokenizers import gpt_oss_tokenizer_dir
from typer.testing import CliRunner

from eagle3kit.chat.reasoning import load_renderer, plain_ids
from eagle3kit.format import DatasetWriter, TokenSample

PAGE = Path(__file__).resolve().parent.parent / "docs" / "validate.md"
COMMAND = "eagle3kit validate gpt-oss-math"
ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"


def build_gpt_oss_math(path: Path, tok_root: Path) -> Path:
    """20 gpt-oss samples; s003 stopped after its analysis, s007 went through text (its
    harmony markers are ordinary characters), s011 was cut off inside its analysis."""
    r = load_renderer(gpt_oss_tokenizer_dir(tok_root))
    ret = r.encode("<|return|>")
    identity = r.identity()
    where = {k: identity.pop(k) for k in ("tokenizer", "chat_template_file")}
    with DatasetWriter(path, config={"stage": "gen", "renderer": identity}, provenance=where) as w:
        w.store_files("tokenizer", r.files())
        for i in range(20):
            turn = (
                f"{ANALYSIS}We add {i} and {i}: that makes {2 * i}.<|end|>"
                f"{FINAL}{i} + {i} = {2 * i}."
            )
            finish = "stop"
            if i == 3:
                completion = r.encode(f"{ANALYSIS}We add {i} and {i}.<|end|><|return|>")
            elif i == 7:
                completion = (plain_ids(r.tokenizer, turn) or []) + ret
            elif i == 11:
                completion, finish = r.encode(f"{ANALYSIS}We add {i} and {i}, then"), "length"
            else:
                completion = r.encode(turn) + ret
            prompt = r.render([{"role": "user", "content": f"What is {i} + {i}?"}])
            w.add(
                TokenSample(f"s{i:03d}", prompt, completion, finish_reason=finish, partition="math")
            )
    return path


def documented_report() -> list[str]:
    """The lines of the page's text block that starts with the command."""
    text = PAGE.read_text()
    block = re.search(r"^```text\n\$ " + re.escape(COMMAND) + r"\n(.*?)^```", text, re.M | re.S)
    assert block, f"docs/validate.md has no text block starting with `$ {COMMAND}`"
    return block.group(1).splitlines()


def run_report(workdir: Path, tok_root: Path) -> tuple[int, list[str]]:
    from eagle3kit.cli import app

    build_gpt_oss_math(workdir / "gpt-oss-math", tok_root)
    result = CliRunner().invoke(
        app, ["validate", str(workdir / "gpt-oss-math")], env={"COLUMNS": "200", "NO_COLOR": "1"}
    )
    lines = result.stderr.replace(str(workdir / "gpt-oss-math"), "gpt-oss-math").splitlines()
    return result.exit_code, lines


def comparable(lines: list[str]) -> list[str]:
    """The profile and the checklist, not the partition table (its width is the terminal's)."""
    keep = re.compile(r"^(gpt-oss-math:|  \S| ?\d+\. |\d+ of \d+ checks|all \d+ checks)")
    return [line.rstrip() for line in lines if keep.match(line)]


def test_gpt_oss_report_is_real(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    code, lines = run_report(tmp_path, tmp_path_factory.getbasetemp())
    assert code == 1
    assert comparable(lines) == comparable(documented_report())


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        code, lines = run_report(Path(tmp), Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp))
    print(f"$ {COMMAND}", *lines, sep="\n")
    print(f"exit {code}", file=sys.stderr)
