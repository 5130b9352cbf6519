"""Grading one notebook: the pytest session and plugin, checks, scoring, the student proxy, experiments."""
