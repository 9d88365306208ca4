"""Ways to reach agents beyond this gateway's own profiles."""
