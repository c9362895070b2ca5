"""The planner: prompts, tools, model providers, and the Decide service that logs each decision."""
