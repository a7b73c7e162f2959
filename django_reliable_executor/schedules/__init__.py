"""Periodic schedules: timing, planning, firing."""
