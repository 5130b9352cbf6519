"""The hidden suites: one pytest module per assignment, test_<id>.py, written as docs/SUITES.md shows."""
