"""One process's own bots: the Dispatcher, the ProfileActor per bot, turn execution (runners,
live-owner handoff), the Roster and the Notifier.
"""
