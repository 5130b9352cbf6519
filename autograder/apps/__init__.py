"""The `course` verbs that are more than a call into one package (demo, doctor)."""
