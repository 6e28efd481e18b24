"""The render step: the selected window as chat messages (the agent's mapper renders
every turn), and the window as stored on the reply's record, with where its prefix
differs from the previous request's (proxy/turn/prompt_cache.py). The surface then
renders these messages into the upstream's request body (``Surface.upstream_request``)."""

from __future__ import annotations

from proxy.services import Services
from proxy.turn import prompt_cache
from proxy.turn.state import Turn


def render(services: Services, turn: Turn) -> None:
    assert turn.window is not None and turn.mapping is not None and turn.sync is not None
    assert turn.snapshot is not None and turn.context is not None
    window, sync = turn.window, turn.sync
    turn.messages = services.mapper.map(window, turn.system_prompt, turn.mapping)
    meta = prompt_cache.window_meta(
        window, prompt_cache.system_hash(turn.system_prompt, turn.request.tools)
    )
    meta["changes"] = prompt_cache.prefix_changes(
        prompt_cache.previous_window(turn.context.messages),
        meta,
        window,
        rewound_after=sync.keep_through if sync.rewind else None,
        earlier=bool(turn.snapshot.meta.head_seq),
    )
    turn.window_meta = meta
