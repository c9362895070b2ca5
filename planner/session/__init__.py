"""Session mode: one multi-turn conversation per task whose reasoning round-trips exactly."""
