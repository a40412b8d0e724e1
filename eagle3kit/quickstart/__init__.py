"""`eagle3kit quickstart`: the whole pipeline on a tiny reasoning target, on CPU, offline.

It makes a tokenizer and an 8-layer target (eagle3kit.tiny), trains the target for a minute or two
on the standard library's docstrings, then runs every stage through its public `run()`:
gen (in-process transformers engine), validate, extract, train, export (vLLM and SGLang
layouts) and bench accept on prompts neither the target nor the drafter saw. It ends with
the predicted and the measured acceptance length, where everything is, and the command line
that runs each stage by hand.

Rerunning continues: DIR/quickstart.json records each finished stage (and the settings the
directory was made with), finished stages are skipped, and an unfinished one is run again in
its own resume mode, so a kill loses at most the uncommitted part of one stage.

run.py runs stages.py's stages in order, keeping state.py's record of DIR (where each
writes: layout.py); result.py is the report, commands.py the by-hand command lines, config.py
the settings. The face other code imports.
"""

from eagle3kit.quickstart.config import QuickstartConfig
from eagle3kit.quickstart.result import QuickstartResult
from eagle3kit.quickstart.run import run

__all__ = ["QuickstartConfig", "QuickstartResult", "run"]
