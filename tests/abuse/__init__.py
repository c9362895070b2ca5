"""Abuse suite: fuzzed messages, forged identities and a canary scan for leaked secrets."""
