"""The cloud's database: typed tables, engine and migrations, and the queries that change state."""
