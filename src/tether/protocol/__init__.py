"""The wire: every key, every value format and the Lua scripts with their typed calls.
What is in Redis is defined here and nowhere else."""
