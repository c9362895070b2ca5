"""Fault suite: real processes killed, restarted and cut off; nothing accepted is lost."""
