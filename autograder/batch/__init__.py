"""Grading many notebooks: finding submissions, the results folder, workers."""
