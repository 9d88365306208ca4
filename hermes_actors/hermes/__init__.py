"""hermes-actors inside the real ``hermes-agent``: the submit endpoint, the plugin, the runners."""
