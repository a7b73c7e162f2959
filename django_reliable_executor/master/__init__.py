"""The master: the duty one worker at a time holds (lock.py), and what it does while it holds
it (loop.py runs chores.py and schedule_firing.py)."""
