"""`eagle3kit gen`: exact-token samples from SGLang, vLLM or transformers, resumable.

`run(GenConfig)` (gen/run.py) loads and renders the prompts, connects to the servers, opens
(or continues) the token dataset and keeps every server slot busy until each sample is in.
"""

from eagle3kit.gen.config import GenConfig, ServerSpec, parse_server
from eagle3kit.gen.jobs import Chain, make_chains, resume_point
from eagle3kit.gen.prompts import load_conversations, select
from eagle3kit.gen.result import GenResult
from eagle3kit.gen.run import load, run
from eagle3kit.gen.types import GenRequest

__all__ = [
    "Chain",
    "GenConfig",
    "GenRequest",
    "GenResult",
    "ServerSpec",
    "load",
    "load_conversations",
    "make_chains",
    "parse_server",
    "resume_point",
    "run",
    "select",
]
