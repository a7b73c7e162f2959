"""Helpers the tests share: worker processes, racers, Redis servers and clusters,
contract and admin helpers (no tests)."""
