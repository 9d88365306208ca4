"""Bot Mode for the real hermes-agent: runners, install facts, setup and the plugin."""
