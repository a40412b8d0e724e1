"""Loading from transformers the way every stage needs it: never a prompt, never a bar.

- Custom code: a model directory whose config or tokenizer names its own Python files
  (`auto_map`) needs `trust_remote_code=True`. Given None, transformers *asks* on a terminal
  (an `input()` with a 15 s alarm) and fails elsewhere; eagle3kit always passes a bool and
  turns the refusal into one line naming the flag, the directory and the files that would run.
  The bool is the command's own --trust-remote-code, never a value read from a dataset,
  run.json or any other file: consent to run code comes from the person at the keyboard.
- Progress: transformers draws "Loading weights" bars that look finished while the stage goes
  on; the stages draw their own progress (`_ui`), so transformers' bars are switched off.

Call `quiet()` before anything is loaded with transformers; `load_config`,
`load_tokenizer` and `load_causal_lm` do, and say what went wrong as a `UserError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3kit.errors import UserError

TRUST_FLAG = "--trust-remote-code"


def quiet() -> None:
    """No progress bars from transformers, and no interactive custom-code question, ever."""
    from transformers import dynamic_module_utils
    from transformers.utils import logging

    logging.disable_progress_bar()
    # 0: where transformers would ask ("Do you wish to run the custom code? [y/N]") it raises.
    dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0


class CustomCodeRefused(UserError):
    """A directory needs its own code to load, and --trust-remote-code was not given."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = Path(path)


AUTO_MAP_FILES = ("config.json", "tokenizer_config.json")


def _auto_map(file: Path) -> dict:
    try:
        auto_map = json.loads(file.read_text()).get("auto_map") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return auto_map if isinstance(auto_map, dict) else {}


def own_code_files(path: Path) -> list[str]:
    """The Python files a model or tokenizer directory's `auto_map` entries name."""
    files: list[str] = []
    for name in AUTO_MAP_FILES:
        auto_map = _auto_map(Path(path) / name)
        for value in auto_map.values():
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, str) and "." in ref:
                    module = ref.split("--")[-1].rsplit(".", 1)[0]
                    files.append(f"{module}.py")
    return list(dict.fromkeys(files))


def is_custom_code_refusal(exc: BaseException) -> bool:
    return "trust_remote_code" in str(exc)


def _where(flag: str, path: Path) -> str:
    """'--target DIR', or the bare path where no flag named it (a dataset's stored copy)."""
    return f"{flag} {path}" if flag else str(path)


def custom_code_error(flag: str, path: Path) -> CustomCodeRefused:
    """The refusal, naming the flag and directory, or, for a directory no flag named (a
    dataset's stored tokenizer), the file whose `auto_map` asks for the code."""
    files = own_code_files(path)
    what = f" ({', '.join(files)})" if files else ""
    mapping = next((Path(path) / n for n in AUTO_MAP_FILES if _auto_map(Path(path) / n)), None)
    if not flag and mapping is not None:
        return CustomCodeRefused(
            f"{mapping}: its auto_map names code of its own{what}; pass {TRUST_FLAG} to run it",
            path,
        )
    return CustomCodeRefused(
        f"{_where(flag, path)}: it ships its own code{what}; pass {TRUST_FLAG} to run it", path
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_config(path: Path, trust_remote_code: bool, flag: str = "--target") -> Any:
    """A model directory's transformers config."""
    quiet()
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            str(path), trust_remote_code=bool(trust_remote_code), local_files_only=True
        )
    except Exception as exc:  # transformers raises many kinds; all mean "not usable here"
        if is_custom_code_refusal(exc) and not trust_remote_code:
            raise custom_code_error(flag, path) from None
        raise UserError(f"{_where(flag, path)}: cannot read its config ({_reason(exc)})") from None


def load_tokenizer(path: Path, trust_remote_code: bool, flag: str = "--tokenizer") -> Any:
    quiet()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            str(path), trust_remote_code=bool(trust_remote_code), local_files_only=True
        )
    except Exception as exc:
        if is_custom_code_refusal(exc) and not trust_remote_code:
            raise custom_code_error(flag, path) from None
        raise UserError(f"{_where(flag, path)}: cannot load a tokenizer: {_reason(exc)}") from None


def load_causal_lm(
    path: Path, trust_remote_code: bool, flag: str = "--target", **options: Any
) -> Any:
    """`AutoModelForCausalLM.from_pretrained`, options passed on (dtype, device_map...)."""
    quiet()
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            str(path), trust_remote_code=bool(trust_remote_code), local_files_only=True, **options
        )
    except Exception as exc:
        if is_custom_code_refusal(exc) and not trust_remote_code:
            raise custom_code_error(flag, path) from None
        raise UserError(
            f"{_where(flag, path)}: cannot load a transformers model ({_reason(exc)})"
        ) from None
