"""How the proxy talks to the models it forwards to."""
