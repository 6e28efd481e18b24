"""Client-facing API surfaces: each wire protocol's request and reply shapes."""
