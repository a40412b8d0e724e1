"""`validate --write-clean` copies only regular files of a dataset's stored tokenizer (issue
25, item 4): a link in a shared dataset's tokenizer/ to a file of this machine (a key, a
password file), or tokenizer/ itself a link to a folder, would otherwise put that file's
bytes into the clean copy, which is made to be shared on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import prewarmed
import pytest

from eagle3kit.format import DatasetWriter, TokenSample

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- not to be shared\n"


def eagle3kit(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prewarmed.argv(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def dataset(path: Path, tokenizer_files: list[Path]) -> Path:
    with DatasetWriter(path) as writer:
        if tokenizer_files:
            writer.store_tokenizer(tokenizer_files)
        for i in range(4):
            writer.add(TokenSample(f"id-{i}", [1, 2, 3], [4, 5, 6 + i]))
    return path


def holds_secret(root: Path) -> list[Path]:
    """Every file under `root` (links not followed) whose bytes hold the secret."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if not path.is_symlink() and SECRET in path.read_bytes():
                found.append(path)
    return found


@pytest.fixture
def secret(tmp_path) -> Path:
    (tmp_path / "home").mkdir()
    path = tmp_path / "home" / "id_ed25519"
    path.write_bytes(SECRET)
    return path


def test_a_linked_file_in_tokenizer_is_not_copied(tmp_path, secret):
    template = tmp_path / "chat_template.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    ds = dataset(tmp_path / "shared", [template])
    link = ds / "tokenizer" / "added_tokens.json"
    link.symlink_to(secret)
    clean = tmp_path / "clean"

    proc = eagle3kit("validate", ds, "--write-clean", clean)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert holds_secret(clean) == []
    assert (
        f"warning: {link}: a symbolic link (to {secret}); not copied into the clean copy"
        in proc.stderr.splitlines()
    )
    assert sorted(p.name for p in (clean / "tokenizer").iterdir()) == ["chat_template.jinja"]
    assert (clean / "tokenizer" / "chat_template.jinja").read_bytes() == template.read_bytes()


def test_a_linked_tokenizer_folder_is_not_copied(tmp_path, secret):
    ds = dataset(tmp_path / "shared", [])
    (ds / "tokenizer").symlink_to(secret.parent, target_is_directory=True)
    clean = tmp_path / "clean"

    proc = eagle3kit("validate", ds, "--write-clean", clean)
    assert "Traceback" not in proc.stderr
    assert holds_secret(clean) == []
    assert (
        f"warning: {ds / 'tokenizer'}: a symbolic link (to {secret.parent}); the clean "
        "copy has no stored tokenizer" in proc.stderr.splitlines()
    ), proc.stderr
    assert not (clean / "tokenizer").exists()
