"""The host's local record of what ran: SQLite tasks + per-step timeline, and an artifact folder."""
