"""The offline demo: four scripted bots and the scripted conversation `make demo` shows."""
