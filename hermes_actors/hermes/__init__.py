"""Bot Mode for the real hermes-agent: the plugin and its host platform, the local submit endpoint,
the runners (CLI and warm API-server turns), install facts and `enable`/`disable`."""
