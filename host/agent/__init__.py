"""The agent loop: perceive, plan, execute, perceive again, record — one step at a time."""
