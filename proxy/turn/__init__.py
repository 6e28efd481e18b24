"""The turn: identify the session, sync history, select the window, persist the reply."""
