"""The chat concepts every stage shares: conversations, rendering with the chat template,
the reasoning markers and what a template says about them.

- `conversation.py`: a prompt record as OpenAI-style messages, and where its turns are.
- `markers.py`: the one table of reasoning and tool-call markers.
- `render.py`: the exact prompt ids the target sees (`Renderer`), and the tokenizer files.
- `reasoning.py`: the reasoning profile learned from the template (`Profile`), for validate.
- `phases.py`: the think / answer / tool-call phase of each token, for bench and train.

Nothing here imports a stage, the UI or the command line; importing it loads no
transformers (the functions that need it import it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eagle3kit._lazy import attribute_loader

_HOMES = {
    "Conversation": "conversation",
    "Renderer": "render",
    "Profile": "reasoning",
    "learn_profile": "reasoning",
    "load_renderer": "reasoning",
}

__all__ = ["Conversation", "Profile", "Renderer", "learn_profile", "load_renderer"]

if TYPE_CHECKING:
    from eagle3kit.chat.conversation import Conversation
    from eagle3kit.chat.reasoning import Profile, learn_profile, load_renderer
    from eagle3kit.chat.render import Renderer

__getattr__ = attribute_loader(__name__, _HOMES)
