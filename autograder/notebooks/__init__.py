"""Notebooks as files: cells by metadata or name, repair, sync/solve/release, example submissions."""
