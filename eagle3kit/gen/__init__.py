"""`eagle3kit gen`: exact-token samples from SGLang, vLLM or transformers, resumable.

`run(GenConfig)` (gen/run.py) loads and renders the prompts, connects to the servers, opens
(or continues) the token dataset and keeps every server slot busy until each sample is in.
"""

from eagle3kit.gen.config import GenConfig, ServerSpec, parse_server
from eagle3kit.gen.jobs import make_chains
from eagle3kit.gen.result import GenResult
from eagle3kit.gen.run import load, run

__all__ = ["GenConfig", "GenResult", "ServerSpec", "load", "make_chains", "parse_server", "run"]
